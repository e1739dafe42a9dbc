// ABI glue of the `hierarchical` plugin: the option schema and the component.
#include "hierarchical_reducer.hpp"

namespace {
namespace sdk = distopt::sdk;
constexpr dopt_option_spec kOptions[] = {
    sdk::option_string("variant", "ring",
                       "ring: reduce-scatter within each node, allreduce of each shard across "
                       "nodes, allgather within the node; leader: reduce to each node's local "
                       "rank 0, allreduce between the leaders, broadcast within the node (the "
                       "variant an `inner:` reducer runs with)")
        .choices("ring|leader"),
};
}  // namespace

DOPT_PLUGIN("hierarchical", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::hierarchical::HierarchicalReducer, "hierarchical",
                           "1.0.0",
                           "two-level mean of each bucket: within nodes, then across nodes "
                           "(Horovod hierarchical allreduce, Bagua hierarchical_reduce); nodes "
                           "from DISTOPT_NODE_ID or the host name; optional inner: reducer "
                           "between the node leaders",
                           kOptions))
