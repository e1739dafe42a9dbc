// ABI glue of the `decentralized` plugin (see decentralized_algorithm.hpp).
#include "decentralized_algorithm.hpp"

namespace {
namespace sdk = distopt::sdk;
constexpr dopt_option_spec kOptions[] = {
    sdk::option_string("topology", "ring",
                       "who averages with whom: ring (left and right, weights 1/3), shift_one "
                       "(Bagua: one rotating peer, even world size), complete (mean over all "
                       "ranks), exponential (peers at distance 2^k), neighbors (explicit lists)")
        .choices("ring|shift_one|complete|exponential|neighbors"),
    sdk::option_string("neighbors", "",
                       "topology: neighbors: symmetric adjacency lists, e.g. \"0:1,3; 1:0,2; "
                       "2:1,3; 3:2,0\" (Metropolis-Hastings weights)"),
    sdk::option_int("communication_interval", "1",
                    "gossip every k-th step; plain local steps between")
        .range(1, 1000000),
    sdk::option_bool("overlap", "true",
                     "start each bucket's exchange during backward, as soon as its gradients "
                     "are ready (same result; false: all exchanges in step())"),
    sdk::option_string("link_schedule", "auto",
                       "how a round's messages share the links: one_at_a_time (a rank receives "
                       "from one neighbour and sends to one at a time, so each link direction "
                       "carries one flow: ranks on several hosts), all_at_once (every send and "
                       "receive in flight together: ranks on one host, where no link is shared), "
                       "auto (one_at_a_time when some ranks run on other hosts); every rank "
                       "must use the same")
        .choices("auto|one_at_a_time|all_at_once"),
    sdk::option_bool("low_precision", "false",
                     "Bagua's low-precision decentralized SGD (DCD-PSGD): exchange 8-bit min-max "
                     "compressed differences (1024-element chunks, ~1/4 of float32's bytes) and "
                     "keep bitwise-identical copies of the neighbours' parameters; ring, "
                     "exponential or neighbors topologies"),
    sdk::option_string("kernels", "auto",
                       "low_precision's min-max codec: host (CPU loops; CPU parameters only), "
                       "torch (libtorch ops on the parameters' device; the same bytes), auto "
                       "(host on CPU, torch elsewhere)")
        .choices("auto|host|torch"),
};
}  // namespace

DOPT_PLUGIN("decentralized", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::decentralized::DecentralizedAlgorithm, "decentralized",
                           "1.0.0",
                           "decentralized SGD (D-PSGD): every rank averages its parameters with "
                           "its topology's neighbours and applies its own gradient",
                           kOptions))
