/*
 * distopt plugin ABI, version 1.x: the part shared by every component kind.
 *
 * Rules (see share/doc/distopt/DESIGN.md, "The plugin ABI"):
 *  - Only C crosses this boundary. Strings are UTF-8, NUL-terminated; arrays
 *    are pointer + count; tensors are borrowed DLPack DLTensor*.
 *  - Every extensible struct starts with `size_t struct_size; void* ext;`.
 *    Fields are only ever appended; a reader checks struct_size (against the
 *    DOPT_<NAME>_STRUCT_SIZE of the field it wants) before reading an appended
 *    field. `ext` is reserved and must be NULL in v1.
 *  - A plugin exports exactly one symbol per ABI major: dopt_plugin_init_v1.
 *    The host refuses another major and loads a newer minor (UCX's rule).
 *  - Functions return dopt_status: 0 is success, negative values are errors.
 *    Detail goes to the host's error sink (dopt_host_api::set_error) before
 *    returning the error, so the host can raise an exception naming plugin,
 *    component, operation and message.
 *  - Every function a plugin exports is noexcept: the SDK glue catches C++
 *    exceptions and turns them into a status plus an error message.
 */
#ifndef DISTOPT_ABI_H
#define DISTOPT_ABI_H

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * ABI versions. A minor only appends fields (each with its *_STRUCT_SIZE
 * macro); a plugin of any earlier minor keeps loading and running.
 *
 *   version  what it added                                  why
 *   1.0      communicator / reducer / algorithm vtables,    the first ABI
 *            option schemas, host services
 *   1.1      save_state / load_state on the reducer and     checkpoints that reshard
 *            algorithm vtables (state.h); the algorithm's   (and bytes reports that
 *            own bytes_sent                                 include ZeRO's traffic)
 *   1.2      dopt_option_spec::flags (open bounds);         "(0, 1]" said exactly; a
 *            dopt_component::traits and ::check_job, the    component refuses a job
 *            job view (job.h)                               at `distopt check` time,
 *                                                           before any rendezvous
 *   1.3      DOPT_TRAIT_WRAPS_REDUCER; dopt_host_api::      a reducer that wraps
 *            inner_reducer and ::create_inner_reducer;      another one (hierarchical
 *            dopt_job_component::inner (job.h)              with powersgd between
 *                                                           nodes), the inner chosen
 *                                                           and validated in YAML
 *   1.4      dopt_component::devices; dopt_communicator_v1  collectives on device
 *            ::set_stream and ::stream_wait                 (kDLCUDA) memory, ordered
 *            (communicator.h, "Device memory")              on the caller's CUDA
 *                                                           stream (nccl); the host
 *                                                           refuses a tensor on a
 *                                                           device a component does
 *                                                           not declare
 *   1.5      dopt_algorithm_v1::set_grad_clip               optimizer.grad_clip for
 *            (algorithm.h)                                  every algorithm: the global
 *                                                           norm is known only inside
 *                                                           the algorithm, between
 *                                                           reduction and update
 *   1.6      dopt_state_writer::put_replicated (state.h)    elastic commits: state
 *                                                           every rank holds whole is
 *                                                           kept by each rank, not
 *                                                           sent to a buddy
 *   1.7      dopt_algorithm_v1::param_sharding,             parameter sharding (ZeRO
 *            ::gather_params, ::wait_params and             stage 3, FSDP): the
 *            ::scatter_params;
 *            dopt_algorithm_args::bucket_sharded            algorithm owns the shards
 *            (algorithm.h, "Parameter sharding")            of a unit's parameters and
 *                                                           gathers them on demand
 *   1.8      dopt_algorithm_v1::discard_step; gathers      parameter sharding under
 *            into a buffer of the model's dtype            mixed precision: the
 *            (algorithm.h, "Parameter sharding")           gradients go to the
 *                                                           algorithm during backward,
 *                                                           before the inf/NaN check
 *   1.9      dopt_algorithm_v1::finish_buckets             parameter sharding: a
 *            (algorithm.h)                                  unit's gradients are freed
 *                                                           before the next unit's take
 *                                                           memory (one unit's at a
 *                                                           time, not two)
 */
#define DOPT_ABI_VERSION_MAJOR 1
#define DOPT_ABI_VERSION_MINOR 9 /* 1.9: finish_buckets (sharded gradients freed earlier) */

/** Offset of the end of MEMBER in TYPE: the struct size a reader needs for it. */
#define DOPT_STRUCT_SIZE_UPTO(TYPE, MEMBER) (offsetof(TYPE, MEMBER) + sizeof(((TYPE*)0)->MEMBER))

/** True when the struct P (of TYPE) is big enough to hold MEMBER. */
#define DOPT_HAS_FIELD(P, TYPE, MEMBER) ((P)->struct_size >= DOPT_STRUCT_SIZE_UPTO(TYPE, MEMBER))

/** Compile-time check of a layout assumption (C11 and C++11). */
#ifdef __cplusplus
#define DOPT_STATIC_ASSERT(COND, MSG) static_assert(COND, MSG)
#else
#define DOPT_STATIC_ASSERT(COND, MSG) _Static_assert(COND, MSG)
#endif

#if defined(_WIN32)
#define DOPT_EXPORT __declspec(dllexport)
#else
#define DOPT_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------- */
/* Status codes. 0 is success; errors are negative (UCX's convention).       */
/* ------------------------------------------------------------------------- */
typedef int32_t dopt_status;

#define DOPT_OK 0          /* success */
#define DOPT_IN_PROGRESS 1 /* not an error: an async request has not completed yet */
#define DOPT_ERR_INVALID_ARGUMENT \
  -1 /* a caller passed a bad pointer, shape, dtype, option or rank */
#define DOPT_ERR_UNSUPPORTED \
  -2                          /* the operation, dtype or op is not implemented by this component */
#define DOPT_ERR_COMM -3      /* a peer died, a connection broke, or a frame was malformed */
#define DOPT_ERR_TIMEOUT -4   /* the operation did not complete within its timeout */
#define DOPT_ERR_NO_MEMORY -5 /* an allocation failed */
#define DOPT_ERR_INTERNAL -6  /* a bug or an unexpected C++ exception inside the component */
#define DOPT_ERR_ABORTED                                                                        \
  -7                      /* the operation was cancelled (communicator destroyed, job stopping) \
                           */
#define DOPT_ERR_STATE -8 /* the call is not valid in the component's current state */

/** Human-readable name of a status code; never NULL, static lifetime. */
static inline const char* dopt_status_string(dopt_status s) {
  switch (s) {
    case DOPT_OK:
      return "OK";
    case DOPT_IN_PROGRESS:
      return "IN_PROGRESS";
    case DOPT_ERR_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case DOPT_ERR_UNSUPPORTED:
      return "UNSUPPORTED";
    case DOPT_ERR_COMM:
      return "COMM_ERROR";
    case DOPT_ERR_TIMEOUT:
      return "TIMEOUT";
    case DOPT_ERR_NO_MEMORY:
      return "NO_MEMORY";
    case DOPT_ERR_INTERNAL:
      return "INTERNAL";
    case DOPT_ERR_ABORTED:
      return "ABORTED";
    case DOPT_ERR_STATE:
      return "STATE";
    default:
      return "UNKNOWN_STATUS";
  }
}

/* ------------------------------------------------------------------------- */
/* Option schemas: each component declares its options; the host validates  */
/* the YAML against them before anything is created.                          */
/* ------------------------------------------------------------------------- */
typedef enum {
  DOPT_OPTION_BOOL = 0,
  DOPT_OPTION_INT = 1,    /* int64 */
  DOPT_OPTION_DOUBLE = 2, /* float64; an integer YAML scalar is accepted */
  DOPT_OPTION_STRING = 3,
} dopt_option_type;

/* dopt_option_spec::flags (ABI 1.2). */
#define DOPT_OPTION_MIN_EXCLUSIVE 0x1u /* min_value itself is refused: (min, ... */
#define DOPT_OPTION_MAX_EXCLUSIVE 0x2u /* max_value itself is refused: ..., max) */

/*
 * One option of a component's schema. Plugins declare arrays of these
 * (dopt_component::options); C++ plugins write them with the builder of
 * distopt/sdk/base/options.hpp (sdk::option_double("ratio", "0.01", "...")
 * .range_open_min(0, 1)).
 *
 * Range (INT and DOUBLE): checked when min_value <= max_value (write 0, -1
 * for "no range"). Each bound is inclusive unless `flags` says it is open; an
 * infinite bound is always open (a value of inf is refused), so "x >= 1" is
 * min 1, max INFINITY and reads [1, inf). `flags` exists from ABI 1.2 on: the
 * host reads it only when struct_size >= DOPT_OPTION_SPEC_V1_2_STRUCT_SIZE,
 * so the finite bounds of a 1.0 / 1.1 plugin stay inclusive.
 *
 * The array's stride is the plugin's sizeof(dopt_option_spec): the host takes
 * it from the ABI minor the plugin declares (dopt_plugin_info::abi_minor) or
 * from struct_size when that is larger, so set struct_size to
 * DOPT_OPTION_SPEC_V1_2_STRUCT_SIZE (or sizeof) when you fill `flags`.
 */
typedef struct dopt_option_spec {
  size_t struct_size;
  void* ext;
  const char* name;          /* YAML key, e.g. "bucket_cap_mb" */
  int32_t type;              /* a dopt_option_type (fixed width, as DLPack holds its enums) */
  const char* default_value; /* as YAML text ("25", "true", "greedy"); NULL = required */
  double min_value;          /* INT/DOUBLE: range, checked when min_value <= max_value */
  double max_value;
  const char* choices; /* STRING: '|'-separated allowed values, or NULL for any */
  const char* help;    /* one line, shown by `distopt plugins` */
  /* ---- ABI 1.2 ---- */
  uint32_t flags; /* DOPT_OPTION_MIN_EXCLUSIVE | DOPT_OPTION_MAX_EXCLUSIVE; 0 = [min, max] */
} dopt_option_spec;
/** The ABI 1.0 / 1.1 size (up to `help`); such specs have inclusive bounds. */
#define DOPT_OPTION_SPEC_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_option_spec, help)
/** The ABI 1.2 size (up to `flags`). */
#define DOPT_OPTION_SPEC_V1_2_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_option_spec, flags)
/* `flags` directly follows the 1.1 layout, and the alignment did not grow:
 * an array of 1.1 specs keeps its stride (its sizeof) for a 1.2 host. */
/* Enum values live in int32_t fields (1.0 and 1.1 declared them with the
 * enum types, which have this size and place on every supported ABI). */
DOPT_STATIC_ASSERT(sizeof(dopt_option_type) == sizeof(int32_t),
                   "dopt_option_type values fit the int32_t field");
DOPT_STATIC_ASSERT(offsetof(dopt_option_spec, type) ==
                       offsetof(dopt_option_spec, name) + sizeof(const char*),
                   "dopt_option_spec.type keeps its 1.0 offset");
DOPT_STATIC_ASSERT(offsetof(dopt_option_spec, flags) == DOPT_OPTION_SPEC_STRUCT_SIZE,
                   "dopt_option_spec::flags must follow help");
DOPT_STATIC_ASSERT(DOPT_OPTION_SPEC_STRUCT_SIZE % sizeof(void*) == 0,
                   "the ABI 1.1 dopt_option_spec ends on a pointer boundary");
DOPT_STATIC_ASSERT(sizeof(dopt_option_spec) >= DOPT_OPTION_SPEC_V1_2_STRUCT_SIZE,
                   "dopt_option_spec holds its 1.2 fields");

/** Validated options of one component instance (host-owned, opaque). */
typedef struct dopt_options dopt_options;

/** The rendezvous key-value store (host-owned, opaque), like c10d's Store. */
typedef struct dopt_store dopt_store;

/* Defined below and in communicator.h / reducer.h (ABI 1.3 host services
 * take pointers to them). */
struct dopt_create_args;
struct dopt_comm_ref;
struct dopt_bucket;
struct dopt_reducer_ref;

/* Log levels for dopt_host_api::log. */
#define DOPT_LOG_DEBUG 0
#define DOPT_LOG_INFO 1
#define DOPT_LOG_WARN 2
#define DOPT_LOG_ERROR 3

/* ------------------------------------------------------------------------- */
/* Host services, passed to dopt_plugin_init_v1 and valid until the plugin    */
/* library is unloaded. Every function is thread-safe.                        */
/* ------------------------------------------------------------------------- */
typedef struct dopt_host_api {
  size_t struct_size;
  void* ext;
  uint32_t abi_major; /* the host's DOPT_ABI_VERSION_MAJOR */
  uint32_t abi_minor;

  /** Log a line. `who` names the component ("tcp"); both strings are copied. */
  void (*log)(int32_t level, const char* who, const char* msg);

  /** Error sink: records msg (copied) as the calling thread's last error. A
   * component calls it right before returning a negative status. */
  void (*set_error)(const char* msg);

  /* Typed getters for validated options. Return DOPT_ERR_INVALID_ARGUMENT if
   * `name` is not in the component's schema or has another type. The string
   * getter's result lives as long as the dopt_options object. */
  dopt_status (*option_bool)(const dopt_options* opts, const char* name, int32_t* out);
  dopt_status (*option_int)(const dopt_options* opts, const char* name, int64_t* out);
  dopt_status (*option_double)(const dopt_options* opts, const char* name, double* out);
  dopt_status (*option_string)(const dopt_options* opts, const char* name, const char** out);

  /* Rendezvous store. Keys are UTF-8 strings; values are bytes. */
  /** Set key to value (len bytes), replacing any earlier value. */
  dopt_status (*store_set)(dopt_store* s, const char* key, const void* value, size_t len);
  /** Wait up to timeout_ms for key to exist, then copy at most cap bytes of its
   * value into buf and its full length into *len. DOPT_ERR_TIMEOUT if absent. */
  dopt_status (*store_get)(dopt_store* s, const char* key, void* buf, size_t cap, size_t* len,
                           int64_t timeout_ms);
  /** Atomically add delta to the int64 counter at key (created as 0); *out = new value. */
  dopt_status (*store_add)(dopt_store* s, const char* key, int64_t delta, int64_t* out);

  /** Add `value` to the job-wide metric counter `name` (e.g. "comm.bytes_sent",
   * in bytes; "comm.seconds", in seconds). Cheap: callable from hot paths. */
  void (*metric_add)(const char* name, double value);

  /* ---- ABI 1.3: inner reducers. Read only when struct_size >=
   * DOPT_HOST_API_V1_3_STRUCT_SIZE (an older host has none: a reducer that
   * needs one refuses with DOPT_ERR_UNSUPPORTED). ----
   *
   * A reducer that declares DOPT_TRAIT_WRAPS_REDUCER may be given another
   * reducer in its YAML section,
   *   reducer: {name: hierarchical, options: {...},
   *             inner: {name: powersgd, options: {rank: 4}}}
   * which the host resolves and validates against the inner's own schema
   * (not the bucketing options: the buckets are the outer reducer's) at
   * check time, like any section. The outer reducer creates it, over a
   * communicator it chose (e.g. one it made with split), and owns it. */

  /** The reducer of the `inner:` key of the section whose validated options
   * are `outer` (the caller's dopt_create_args::options, or a
   * dopt_job_component::options at check time). *name = its YAML name, or
   * NULL when the section has no `inner:`; *traits = the DOPT_TRAIT_* it
   * declares (0 when none). Either pointer may be NULL. The name lives as
   * long as `outer`. INVALID_ARGUMENT for a NULL `outer`. */
  dopt_status (*inner_reducer)(const dopt_options* outer, const char** name, uint32_t* traits);
  /** Create this rank's instance of that inner reducer: its vtable's create
   * with a copy of `args` whose `options` are the inner's validated options
   * (the caller's `options` field is ignored), over `comm`, with `buckets`
   * (borrowed by the inner as by any reducer: stable until it is
   * destroyed). `args` describes the rank in `comm` (rank, world_size) and
   * needs its own `scope` (e.g. the caller's + "/inner"); store, job_token
   * and bind_address are normally the caller's. Collective over `comm` when
   * the inner's create is (create it on every rank of `comm`, in the same
   * order). On success *out holds the inner's vtable and instance: the
   * caller owns it and destroys it with out->vt->destroy(out->reducer)
   * before `comm` goes away; the vtable lives until the host unloads
   * plugins. Check out->vt->struct_size before using save_state /
   * load_state (an inner of ABI 1.0 has none). Errors: DOPT_ERR_STATE when
   * `outer` has no inner; else the inner's create status, its message in
   * the error sink. */
  dopt_status (*create_inner_reducer)(const dopt_options* outer,
                                      const struct dopt_create_args* args,
                                      const struct dopt_comm_ref* comm,
                                      const struct dopt_bucket* buckets, size_t num_buckets,
                                      struct dopt_reducer_ref* out);
} dopt_host_api;
/** The ABI 1.0 - 1.2 size (up to `metric_add`). */
#define DOPT_HOST_API_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_host_api, metric_add)
/** The ABI 1.3 size (up to `create_inner_reducer`). */
#define DOPT_HOST_API_V1_3_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_host_api, create_inner_reducer)

/* ------------------------------------------------------------------------- */
/* What every component instance is created with.                             */
/* ------------------------------------------------------------------------- */
typedef struct dopt_create_args {
  size_t struct_size;
  void* ext;
  int32_t rank; /* this process's rank in the job, 0..world_size-1 */
  int32_t world_size;
  int32_t local_rank; /* rank among the processes on this host */
  int32_t local_world_size;
  const dopt_options* options; /* validated against the component's schema */
  dopt_store* store;           /* rendezvous store shared by the job */
  const char* scope;           /* unique per instance and identical across ranks; prefix
                                  store keys with it so instances do not collide */
  const char* job_token;       /* secret shared by the job's ranks; peers must present it */
  const char* bind_address;    /* interface to bind listening sockets to ("127.0.0.1") */
} dopt_create_args;
#define DOPT_CREATE_ARGS_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_create_args, bind_address)

/* ------------------------------------------------------------------------- */
/* Plugin entry point.                                                        */
/* ------------------------------------------------------------------------- */
typedef enum {
  DOPT_KIND_COMMUNICATOR = 1,
  DOPT_KIND_REDUCER = 2,
  DOPT_KIND_ALGORITHM = 3,
} dopt_component_kind;

/* The job as one component sees it at check time (job.h). */
typedef struct dopt_job dopt_job;

/* dopt_component::traits (ABI 1.2): properties a component declares, which
 * other components read from the job view (dopt_job_component::traits). */
/** Reducer: the result is the exact mean over ranks of each bucket (up to the
 * rounding of a floating-point sum), whatever the reducer's options: no
 * compression, no scaling, no error feedback. An algorithm may then average
 * the gradients itself (ZeRO stage 2's reduce-scatter) without changing what
 * the job computes. */
#define DOPT_TRAIT_EXACT_MEAN 0x1u
/** Algorithm: between synchronisations every rank holds its own replica of
 * the parameters (decentralized SGD, local SGD). The host then evaluates and
 * checkpoints their mean over ranks (one allreduce of the parameters: the
 * checkpoint's model, and `consolidate`'s), reports the consensus distance,
 * and the algorithm saves its own replica as DOPT_STATE_RANK_LOCAL state. */
#define DOPT_TRAIT_LOCAL_REPLICAS 0x2u
/** Reducer (ABI 1.3): takes another reducer in the `inner:` key of its YAML
 * section and creates it with dopt_host_api::create_inner_reducer. The host
 * refuses `inner:` under a reducer without this trait at check time. The
 * DOPT_TRAIT_EXACT_MEAN of such a reducer describes its own steps: the host
 * reports it (in the job view, and in its own checks) only when the inner
 * declares it too, or when there is no inner. */
#define DOPT_TRAIT_WRAPS_REDUCER 0x4u

/* dopt_component::devices (ABI 1.4): the DLPack device types (DLDeviceType,
 * each < 32) whose memory the component accepts in the tensors it is given,
 * one bit per type. */
#define DOPT_DEVICE_BIT(DEVICE_TYPE) (1u << (uint32_t)(DEVICE_TYPE))
/** What a component that declares nothing accepts (ABI 1.0 - 1.3, or 1.4
 * with devices = 0): host memory only. */
#define DOPT_DEVICES_DEFAULT DOPT_DEVICE_BIT(kDLCPU)

typedef struct dopt_component {
  size_t struct_size;
  void* ext;
  int32_t kind;            /* a dopt_component_kind (fixed width, as DLPack holds its enums) */
  const char* name;        /* the name YAML selects, e.g. "tcp" */
  const char* version;     /* the component's own version, e.g. "1.0.0" */
  const char* description; /* one line */
  const dopt_option_spec* options;
  size_t num_options;
  /* Points to a dopt_communicator_v1, dopt_reducer_v1 or dopt_algorithm_v1
   * according to `kind`; each begins with struct_size. */
  const void* vtable;

  /* ---- ABI 1.2. Read only when struct_size >= DOPT_COMPONENT_V1_2_STRUCT_SIZE;
   * a 1.0 / 1.1 component declares no traits and cannot refuse a job. ---- */

  /** DOPT_TRAIT_* bits; 0 for none. (32 bits, so that the struct's
   * alignment stays a pointer's, as in 1.1.) */
  uint32_t traits;
  /** Optional (NULL: accept every job its option schema accepts). Called by
   * the host after it validated every section of a job against the schemas,
   * before anything is created or connected (`distopt check`, and `distopt
   * train` / Runtime on every rank before the rendezvous), for each selected
   * component that has it. Return DOPT_OK to accept; to refuse, call
   * job->reject(job, key, message) and return a negative status
   * (DOPT_ERR_INVALID_ARGUMENT, or DOPT_ERR_UNSUPPORTED for a combination it
   * does not implement). See job.h for what the view holds, its lifetime and
   * the rules (no side effects, no communication). */
  dopt_status (*check_job)(const dopt_job* job);

  /* ---- ABI 1.4. Read only when struct_size >= DOPT_COMPONENT_V1_4_STRUCT_SIZE;
   * a 1.0 - 1.3 component accepts host memory only. ---- */

  /** DOPT_DEVICE_BIT(t) for each DLDeviceType t whose memory the component
   * accepts; 0 means DOPT_DEVICES_DEFAULT (kDLCPU). The rule is exact:
   * kDLCUDAHost (pinned host memory) is its own type and is accepted only when
   * listed. The host refuses a tensor on another device before it reaches the
   * component (communicators: DOPT_ERR_UNSUPPORTED naming the component, the
   * device and the operation, also for calls through a reducer's or an
   * algorithm's dopt_comm_ref; see communicator.h, "Device memory").
   * Reducers and algorithms: the host refuses to build an optimizer (and to
   * switch to one) whose parameters, and so gradient buckets, are on a device
   * the algorithm, the reducer or its inner reducer does not list
   * (DOPT_ERR_UNSUPPORTED naming the component, the device, what it lists
   * and the parameter). A component that lists kDLCUDA implements
   * set_stream / stream_wait (communicators) and orders its device work as
   * communicator.h says; a reducer or algorithm that lists it touches tensors
   * only through device-generic operations (no host reads of their data). */
  uint32_t devices;
} dopt_component;
/** The ABI 1.0 / 1.1 size (up to `vtable`). */
#define DOPT_COMPONENT_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_component, vtable)
/** The ABI 1.2 / 1.3 size (up to `check_job`). The components array's stride
 * is the plugin's sizeof(dopt_component), as for dopt_option_spec: taken from
 * the declared ABI minor, or from struct_size when that is larger. */
#define DOPT_COMPONENT_V1_2_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_component, check_job)
/** The ABI 1.4 size (up to `devices`); sizeof(dopt_component) rounds it up to
 * a pointer's alignment (4 bytes of tail padding on LP64). */
#define DOPT_COMPONENT_V1_4_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_component, devices)
DOPT_STATIC_ASSERT(sizeof(dopt_component_kind) == sizeof(int32_t),
                   "dopt_component_kind values fit the int32_t field");
DOPT_STATIC_ASSERT(offsetof(dopt_component, kind) == offsetof(dopt_component, ext) + sizeof(void*),
                   "dopt_component.kind keeps its 1.0 offset");
DOPT_STATIC_ASSERT(offsetof(dopt_component, traits) == DOPT_COMPONENT_STRUCT_SIZE,
                   "dopt_component::traits must follow vtable");
DOPT_STATIC_ASSERT(DOPT_COMPONENT_STRUCT_SIZE % sizeof(void*) == 0,
                   "the ABI 1.1 dopt_component ends on a pointer boundary");
DOPT_STATIC_ASSERT(offsetof(dopt_component, devices) == DOPT_COMPONENT_V1_2_STRUCT_SIZE,
                   "dopt_component::devices must follow check_job (1.2 had no tail padding)");
DOPT_STATIC_ASSERT(sizeof(dopt_component) >= DOPT_COMPONENT_V1_4_STRUCT_SIZE,
                   "dopt_component holds its 1.4 fields");

typedef struct dopt_plugin_info {
  size_t struct_size;
  void* ext;
  uint32_t abi_major; /* filled by the plugin: the DOPT_ABI_VERSION_* it was built against */
  uint32_t abi_minor;
  const char* plugin_name; /* e.g. "compress" */
  const char* plugin_version;
  const dopt_component* components; /* static lifetime (until unload) */
  size_t num_components;
} dopt_plugin_info;
#define DOPT_PLUGIN_INFO_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_plugin_info, num_components)

/** Name of the entry symbol of ABI major 1. */
#define DOPT_PLUGIN_ENTRY_V1 "dopt_plugin_init_v1"

/** The entry every plugin of ABI major 1 exports. The host fills `info`'s
 * struct_size and zeroes the rest; the plugin fills the fields it knows.
 * `host` stays valid until the library is unloaded. */
typedef dopt_status (*dopt_plugin_init_v1_fn)(const dopt_host_api* host, dopt_plugin_info* info);

#ifdef __cplusplus
}
#endif

#endif /* DISTOPT_ABI_H */
