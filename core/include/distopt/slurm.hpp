// Slurm's environment, as detect_process_info (process.hpp) and
// `distopt launch` read it: under srun, ranks come from SLURM_PROCID /
// SLURM_NTASKS / SLURM_LOCALID / SLURM_NTASKS_PER_NODE (else this node's
// count in SLURM_TASKS_PER_NODE, node SLURM_NODEID); the rendezvous is
// DISTOPT_RENDEZVOUS, else tcp://MASTER_ADDR:MASTER_PORT where MASTER_ADDR
// defaults to the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST /
// SLURM_NODELIST (where srun starts task 0) and MASTER_PORT to
// slurm_default_port(); the job token is DISTOPT_JOB_TOKEN, else
// "slurm-JOBID.STEPID" (every task of the step has it; another job's are
// refused).
#pragma once

#include <string>
#include <vector>

namespace distopt {

/// Expand a Slurm host list ("node[01-04,07]", "a,b", "r[1-2]n[1,3]") into
/// host names in order, keeping zero padding. Throws ConfigError naming
/// `what` (the variable) for an unbalanced bracket or a bad range.
std::vector<std::string> expand_slurm_nodelist(const std::string& list,
                                               const std::string& what = "SLURM_JOB_NODELIST");

/// The rendezvous port under Slurm when MASTER_PORT is unset:
/// 29500 + SLURM_JOB_ID % 1000 (29500 without a job id), so two jobs sharing
/// a node rarely pick the same one.
int slurm_default_port();

/// The number of tasks on node `node` from a tasks-per-node list such as
/// "2(x3),1" (nodes 0..2 run 2, node 3 runs 1). Throws ConfigError naming
/// `what` when malformed or too short.
int slurm_tasks_on_node(const std::string& list, int node,
                        const std::string& what = "SLURM_TASKS_PER_NODE");

}  // namespace distopt
