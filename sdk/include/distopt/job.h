/*
 * distopt plugin ABI v1.2: the whole job as a component sees it at check
 * time, and how a component refuses a job (dopt_component::check_job).
 *
 * Why: an option schema judges one component's options alone. Some
 * combinations are wrong only together (ZeRO stage 2 never calls the
 * reducer, so a compressing reducer would silently not apply; an algorithm
 * that implements only SGD cannot run `optimizer: adam`). check_job lets the
 * component that knows refuse such a job where the user reads the answer:
 * at `distopt check`, and in `distopt train` / Runtime on every rank before
 * the rendezvous, as "FILE:LINE:COLUMN: KEY: MESSAGE" at the YAML key that
 * chose it, instead of on every rank after connecting.
 *
 * When: the host calls check_job of each selected component that has one
 * (communicator, then reducer, then the reducer's inner (ABI 1.3), then
 * algorithm; the first refusal wins) after
 * it parsed the job file and validated every section against the schemas
 * (keys, types, ranges, required options), and before it creates or
 * connects anything.
 *
 * What check_job may do: read the view; read option values with the host's
 * typed getters (dopt_host_api::option_bool / _int / _double / _string) on
 * the dopt_options handles below; log; call job->reject. Nothing else: no
 * store, no communication, no threads, no state kept between calls (the
 * same job is checked once per process, on every rank, and `distopt check`
 * creates nothing afterwards).
 *
 * Ownership and lifetime: the host owns everything reachable from the
 * dopt_job (strings, arrays, the dopt_job_component structs, the option
 * handles); all of it is valid only until check_job returns. Copy what you
 * want to keep (nothing should be needed).
 *
 * Thread safety: check_job is called on the thread that validates the job,
 * possibly several times in one process and concurrently for independent
 * jobs (two Runtimes built on two threads): it must be reentrant (no mutable
 * global state). The view is immutable. reject() may be called only from
 * inside that call, on that thread.
 *
 * Errors: return DOPT_OK to accept. To refuse, call
 *   job->reject(job, key, message)
 * and return a negative status: DOPT_ERR_INVALID_ARGUMENT for a combination
 * that makes no sense, DOPT_ERR_UNSUPPORTED for one the component does not
 * implement. `key` is the dotted YAML path of the setting the user should
 * change, as written in the job file:
 *   "algorithm.options.stage", "reducer.name", "reducer.options.ratio",
 *   "optimizer.name", "optimizer.momentum" (the optimizer's options sit in
 *   its section), "precision.dtype", "world.size";
 * NULL or "" means the component's own section ("algorithm"). An inner
 * reducer (ABI 1.3) is asked with `self` = its own view (reducer->inner)
 * and names its keys as if it were the top-level reducer: the host reads
 * "reducer.options.rank" from it as "reducer.inner.options.rank" (and
 * "reducer" / "" as "reducer.inner"). `message` says
 * why, and what to do instead; the host prefixes the kind and name of the
 * component that refused. Both strings are copied; a second reject() in one
 * call is ignored (the first one names the problem). The host reports the
 * location of the key's value when the file writes it, else of the closest
 * enclosing section it writes, else the file alone (a default).
 * A negative status without reject() is reported with the message of the
 * host's error sink (dopt_host_api::set_error) at the component's section;
 * a non-negative status after reject() accepts the job (reject only gives
 * the detail). The C++ SDK (distopt/sdk/base/job_view.hpp) maps a static
 * `check_job(const sdk::JobView&)` of the component class onto this.
 */
#ifndef DISTOPT_JOB_H
#define DISTOPT_JOB_H

#include "distopt/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One selected component of the job, resolved and validated by the host. */
typedef struct dopt_job_component {
  size_t struct_size;
  void* ext;
  int32_t kind;            /* a dopt_component_kind */
  const char* name;        /* as selected in YAML, e.g. "topk" */
  const char* version;     /* the component's own version */
  const char* plugin_name; /* the plugin that provides it, e.g. "compress" */
  const char* plugin_file; /* path of that plugin's library */
  uint32_t abi_minor;      /* the ABI minor that plugin was built against */
  uint32_t traits;         /* DOPT_TRAIT_* it declares (0 for a 1.0 / 1.1 plugin) */
  /** Its validated options, defaults filled in; a reducer's also hold the
   * host's bucketing options (bucket_cap_mb, align_bytes, overlap). Read them
   * with dopt_host_api::option_* (INVALID_ARGUMENT for a name it lacks). */
  const dopt_options* options;
  /** The names and types of every option in `options` (num_options each),
   * in schema order; NULL when num_options is 0. */
  const char* const* option_names;
  const int32_t* option_types; /* dopt_option_type values */
  size_t num_options;
  /* ---- ABI 1.3. Read only when struct_size >= DOPT_JOB_COMPONENT_V1_3_STRUCT_SIZE. ---- */
  /** The reducer of this section's `inner:` key (dopt_host_api::
   * create_inner_reducer), resolved and validated against its own schema;
   * NULL when there is none (always NULL for communicators, algorithms, and
   * for the inner itself). Its `traits` are what it declares; the outer's
   * `traits` already drop DOPT_TRAIT_EXACT_MEAN when the inner lacks it. */
  const struct dopt_job_component* inner;
} dopt_job_component;
/** The ABI 1.2 size (up to `num_options`). */
#define DOPT_JOB_COMPONENT_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_job_component, num_options)
/** The ABI 1.3 size (up to `inner`). */
#define DOPT_JOB_COMPONENT_V1_3_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_job_component, inner)

/** The validated job. */
struct dopt_job {
  size_t struct_size;
  void* ext;
  const char* file; /* the job file as the host was given it ("<string>" for text); messages only */
  /** Ranks the job runs on: the launcher's count in `distopt train` /
   * Runtime, world.size of the file in `distopt check` (default 1). */
  int32_t world_size;
  /** The component being asked: the same pointer as one of the three below. */
  const dopt_job_component* self;
  const dopt_job_component* communicator;
  const dopt_job_component* reducer;
  const dopt_job_component* algorithm;
  const char* optimizer_name;            /* optimizer.name: "sgd", "adam", "adamw", ... */
  const dopt_options* optimizer_options; /* lr, momentum, ... validated, defaults filled in */
  const char* const* optimizer_option_names;
  const int32_t* optimizer_option_types; /* dopt_option_type values */
  size_t num_optimizer_options;
  /** precision.dtype: "fp32" (no mixed precision, the default), "bf16" or "fp16". */
  const char* precision_dtype;
  /** Host callback: record why the job is refused (see the header comment).
   * Never NULL. */
  void (*reject)(const dopt_job* job, const char* key, const char* message);
};
#define DOPT_JOB_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_job, reject)

#ifdef __cplusplus
}
#endif

#endif /* DISTOPT_JOB_H */
