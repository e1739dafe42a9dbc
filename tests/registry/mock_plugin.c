/*
 * Mock plugins for the registry (loader) tests, built from this one source
 * with -D variants, the way the Vulkan loader tests its driver interface:
 *
 *   (none)            good: communicator "mock", reducer "mock" (with an option
 *                     schema), algorithms "mock" and "mock_req" (a required option)
 *   MOCK_BAD_MAJOR    declares ABI major DOPT_ABI_VERSION_MAJOR + 1
 *   MOCK_NEWER_MINOR  declares a newer ABI minor and larger (appended-field)
 *                     structs; must still load
 *   MOCK_NO_ENTRY     exports no dopt_plugin_init_v1
 *   MOCK_NULL_FN      communicator "mock_nullfn" with a NULL allreduce
 *   MOCK_DUP          communicator "mock" again (a duplicate of the good one)
 *   MOCK_INIT_FAIL    the entry reports an error through the host's error sink
 *   MOCK_BAD_DEFAULT  an int option whose default is not an integer
 *   MOCK_SMALL_STRUCT a component struct_size smaller than the v1.0 size
 *   MOCK_MISSING_DEP  links a library the loader cannot find
 *   MOCK_ABI_1_1      an ABI 1.1 build: dopt_component and dopt_option_spec
 *                     laid out as 1.1 declared them (no traits / check_job,
 *                     no option flags), two components with options; must
 *                     load, with inclusive bounds, and check
 *   MOCK_ABI_1_3      an ABI 1.3 build: dopt_component without `devices`
 *                     (communicator and reducer "mock_v13"); must load with
 *                     host memory only (kDLCPU)
 *   MOCK_DEVICES      an ABI 1.4 build declaring devices: communicator
 *                     "mock_cuda" (kDLCUDA only) and reducer "mock_cuda"
 *                     (kDLCPU and kDLCUDA)
 *
 * The good variant is an ABI 1.2 build: the reducer "mock" declares the
 * exact-mean trait and an open bound (ratio in (0, 1]); the algorithm "mock"
 * refuses stage 3 with reducer mode 'slow' through job->reject (naming
 * algorithm.options.stage), and "mock_req" refuses more than 4 ranks with
 * only the error sink (the host reports it at the section).
 *
 * Only rank/world_size/create/destroy do real work (all the loader tests
 * call); the data-moving functions return DOPT_ERR_UNSUPPORTED: no test moves
 * data through a mock.
 */
#include <stdlib.h>
#include <string.h>

#include "distopt/algorithm.h"
#include "distopt/communicator.h"
#include "distopt/job.h"
#include "distopt/reducer.h"

#ifndef MOCK_PREFIX
#define MOCK_PREFIX "mock"
#endif

static const dopt_host_api* g_host;

static dopt_status unsupported(void) {
  if (g_host) g_host->set_error("mock plugin: operation not implemented (loader-test fixture)");
  return DOPT_ERR_UNSUPPORTED;
}

/* ---------------- communicator ---------------- */
struct dopt_comm {
  int32_t rank, world_size;
};
static dopt_status comm_create(const dopt_create_args* a, dopt_comm** out) {
  dopt_comm* c = (dopt_comm*)malloc(sizeof *c);
  if (!c) return DOPT_ERR_NO_MEMORY;
  c->rank = a ? a->rank : 0;
  c->world_size = a ? a->world_size : 1;
  *out = c;
  return DOPT_OK;
}
static dopt_status comm_destroy(dopt_comm* c) {
  free(c);
  return DOPT_OK;
}
static int32_t comm_rank(const dopt_comm* c) { return c->rank; }
static int32_t comm_world_size(const dopt_comm* c) { return c->world_size; }
static dopt_status comm_allreduce(dopt_comm* c, const DLTensor* s, DLTensor* r, dopt_reduce_op op,
                                  dopt_request** q) {
  (void)c, (void)s, (void)r, (void)op, (void)q;
  return unsupported();
}
static dopt_status comm_reduce_scatter(dopt_comm* c, const DLTensor* s, DLTensor* r,
                                       dopt_reduce_op op, dopt_request** q) {
  (void)c, (void)s, (void)r, (void)op, (void)q;
  return unsupported();
}
static dopt_status comm_allgather(dopt_comm* c, const DLTensor* s, DLTensor* r, dopt_request** q) {
  (void)c, (void)s, (void)r, (void)q;
  return unsupported();
}
static dopt_status comm_broadcast(dopt_comm* c, DLTensor* b, int32_t root, dopt_request** q) {
  (void)c, (void)b, (void)root, (void)q;
  return unsupported();
}
static dopt_status comm_send(dopt_comm* c, const DLTensor* b, int32_t p, int32_t t,
                             dopt_request** q) {
  (void)c, (void)b, (void)p, (void)t, (void)q;
  return unsupported();
}
static dopt_status comm_recv(dopt_comm* c, DLTensor* b, int32_t p, int32_t t, dopt_request** q) {
  (void)c, (void)b, (void)p, (void)t, (void)q;
  return unsupported();
}
static dopt_status comm_barrier(dopt_comm* c, dopt_request** q) {
  (void)c, (void)q;
  return unsupported();
}
static dopt_status comm_split(dopt_comm* c, int32_t color, int32_t key, dopt_comm** out) {
  (void)c, (void)color, (void)key, (void)out;
  return unsupported();
}
static dopt_status comm_test(dopt_request* q, int32_t* done) {
  (void)q, (void)done;
  return unsupported();
}
static dopt_status comm_wait(dopt_request* q, int64_t t) {
  (void)q, (void)t;
  return unsupported();
}
static void comm_request_free(dopt_request* q) { (void)q; }

static const dopt_communicator_v1 k_comm_vt = {
    DOPT_COMMUNICATOR_V1_STRUCT_SIZE,
    NULL,
    comm_create,
    comm_destroy,
    comm_rank,
    comm_world_size,
#ifdef MOCK_NULL_FN
    NULL, /* allreduce: the required function this variant leaves out */
#else
    comm_allreduce,
#endif
    comm_reduce_scatter,
    comm_allgather,
    comm_broadcast,
    comm_send,
    comm_recv,
    comm_barrier,
    comm_split,
    comm_test,
    comm_wait,
    comm_request_free};

/* ---------------- reducer ---------------- */
static dopt_status red_create(const dopt_create_args* a, dopt_comm_ref c, const dopt_bucket* b,
                              size_t n, dopt_reducer** out) {
  (void)a, (void)c, (void)b, (void)n, (void)out;
  return unsupported();
}
static dopt_status red_destroy(dopt_reducer* r) {
  (void)r;
  return DOPT_OK;
}
static dopt_status red_reduce(dopt_reducer* r, const dopt_bucket* b, dopt_reduce_request** q) {
  (void)r, (void)b, (void)q;
  return unsupported();
}
static dopt_status red_test(dopt_reduce_request* q, int32_t* done) {
  (void)q, (void)done;
  return unsupported();
}
static dopt_status red_wait(dopt_reduce_request* q, int64_t t) {
  (void)q, (void)t;
  return unsupported();
}
static void red_request_free(dopt_reduce_request* q) { (void)q; }
static uint64_t red_bytes_sent(const dopt_reducer* r) {
  (void)r;
  return 0;
}
static const dopt_reducer_v1 k_red_vt = {DOPT_REDUCER_V1_STRUCT_SIZE,
                                         NULL,
                                         red_create,
                                         red_destroy,
                                         red_reduce,
                                         red_test,
                                         red_wait,
                                         red_request_free,
                                         red_bytes_sent,
                                         NULL, /* ABI 1.0: no save_state / load_state */
                                         NULL};

/* ---------------- algorithm ---------------- */
static dopt_status alg_create(const dopt_algorithm_args* a, dopt_algorithm** out) {
  (void)a, (void)out;
  return unsupported();
}
static dopt_status alg_destroy(dopt_algorithm* a) {
  (void)a;
  return DOPT_OK;
}
static dopt_status alg_on_bucket_ready(dopt_algorithm* a, const dopt_bucket* b) {
  (void)a, (void)b;
  return unsupported();
}
static dopt_status alg_step(dopt_algorithm* a) {
  (void)a;
  return unsupported();
}
static dopt_status alg_set_lr(dopt_algorithm* a, int32_t g, double lr) {
  (void)a, (void)g, (void)lr;
  return unsupported();
}
static uint64_t alg_state_bytes(const dopt_algorithm* a) {
  (void)a;
  return 0;
}
static const dopt_algorithm_v1 k_alg_vt = {DOPT_ALGORITHM_V1_STRUCT_SIZE,
                                           NULL,
                                           alg_create,
                                           alg_destroy,
                                           alg_on_bucket_ready,
                                           alg_step,
                                           alg_set_lr,
                                           alg_state_bytes,
                                           NULL, /* ABI 1.0: no save_state / load_state */
                                           NULL,
                                           NULL};

/* ---------------- job checks (ABI 1.2) ---------------- */
/* "mock": stage 3 cannot run with the mock reducer in mode 'slow'. */
static dopt_status alg_check_job(const dopt_job* job) {
  int64_t stage = 0;
  const char* mode = NULL;
  if (g_host->option_int(job->self->options, "stage", &stage) != DOPT_OK) return DOPT_ERR_INTERNAL;
  if (stage != 3 || strcmp(job->reducer->name, "mock") != 0) return DOPT_OK;
  if (g_host->option_string(job->reducer->options, "mode", &mode) == DOPT_OK && mode &&
      strcmp(mode, "slow") == 0) {
    job->reject(job, "algorithm.options.stage",
                "mock: stage 3 cannot run with reducer mode 'slow'");
    return DOPT_ERR_INVALID_ARGUMENT;
  }
  return DOPT_OK;
}
/* "mock_req": at most 4 ranks; says so through the error sink only. */
static dopt_status req_check_job(const dopt_job* job) {
  if (job->world_size <= 4) return DOPT_OK;
  g_host->set_error("mock_req: at most 4 ranks");
  return DOPT_ERR_UNSUPPORTED;
}

/* ---------------- option schemas ---------------- */
#define SPEC(NAME, TYPE, DEF, LO, HI, CHOICES, HELP) \
  { DOPT_OPTION_SPEC_V1_2_STRUCT_SIZE, NULL, NAME, TYPE, DEF, LO, HI, CHOICES, HELP, 0 }

static const dopt_option_spec k_red_options[] = {
    SPEC("level", DOPT_OPTION_INT, "3", 0, 10, NULL, "compression level"),
    {DOPT_OPTION_SPEC_V1_2_STRUCT_SIZE, NULL, "ratio", DOPT_OPTION_DOUBLE, "0.5", 0, 1, NULL,
     "fraction kept", DOPT_OPTION_MIN_EXCLUSIVE}, /* (0, 1] */
    SPEC("mode", DOPT_OPTION_STRING, "fast", 0, -1, "fast|slow", "how hard to try"),
    SPEC("verbose", DOPT_OPTION_BOOL, "false", 0, -1, NULL, "log every bucket"),
};
static const dopt_option_spec k_alg_options[] = {
    SPEC("stage", DOPT_OPTION_INT, "1", 1, 3, NULL, "sharding stage"),
};
static const dopt_option_spec k_req_options[] = {
    SPEC("target", DOPT_OPTION_STRING, NULL, 0, -1, NULL, "a required option"),
};
#ifdef MOCK_BAD_DEFAULT
static const dopt_option_spec k_bad_default_options[] = {
    SPEC("count", DOPT_OPTION_INT, "many", 0, 100, NULL, "default is not an integer"),
};
#endif

#define COMPONENT_EX(KIND, NAME, OPTS, NOPTS, VT, TRAITS, CHECK)                                   \
  {                                                                                                \
    DOPT_COMPONENT_V1_2_STRUCT_SIZE, NULL, KIND, NAME, "0.1.0", "mock for the loader tests", OPTS, \
        NOPTS, VT, TRAITS, CHECK                                                                   \
  }
#define COMPONENT(KIND, NAME, OPTS, NOPTS, VT) COMPONENT_EX(KIND, NAME, OPTS, NOPTS, VT, 0, NULL)

#if defined(MOCK_ABI_1_1)
/* dopt_option_spec and dopt_component exactly as the ABI 1.1 headers laid
 * them out: the host must walk both arrays with these (smaller) strides and
 * read no 1.2 field. */
typedef struct {
  size_t struct_size;
  void* ext;
  const char* name;
  dopt_option_type type;
  const char* default_value;
  double min_value, max_value;
  const char* choices;
  const char* help;
} spec_v1_1;
typedef struct {
  size_t struct_size;
  void* ext;
  dopt_component_kind kind;
  const char *name, *version, *description;
  const spec_v1_1* options;
  size_t num_options;
  const void* vtable;
} component_v1_1;
DOPT_STATIC_ASSERT(sizeof(spec_v1_1) == DOPT_OPTION_SPEC_STRUCT_SIZE, "1.1 spec layout");
DOPT_STATIC_ASSERT(sizeof(component_v1_1) == DOPT_COMPONENT_STRUCT_SIZE, "1.1 component layout");
DOPT_STATIC_ASSERT(sizeof(component_v1_1) < sizeof(dopt_component), "1.2 grew the component");
static const spec_v1_1 k_v11_red_options[] = {
    {sizeof(spec_v1_1), NULL, "ratio", DOPT_OPTION_DOUBLE, "0.5", 0, 1, NULL, "inclusive [0, 1]"},
    {sizeof(spec_v1_1), NULL, "level", DOPT_OPTION_INT, "3", 0, 10, NULL, "second option"},
};
static const spec_v1_1 k_v11_alg_options[] = {
    {sizeof(spec_v1_1), NULL, "stage", DOPT_OPTION_INT, "1", 1, 3, NULL, "sharding stage"},
    {sizeof(spec_v1_1), NULL, "mode", DOPT_OPTION_STRING, "fast", 0, -1, "fast|slow", "a choice"},
};
static const component_v1_1 k_components[] = {
    {sizeof(component_v1_1), NULL, DOPT_KIND_REDUCER, "mock_v11", "1.1.0", "an ABI 1.1 reducer",
     k_v11_red_options, 2, &k_red_vt},
    {sizeof(component_v1_1), NULL, DOPT_KIND_ALGORITHM, "mock_v11", "1.1.0", "an ABI 1.1 algorithm",
     k_v11_alg_options, 2, &k_alg_vt},
};
#define COMPONENTS ((const dopt_component*)(const void*)k_components)
#define NUM_COMPONENTS 2
#elif defined(MOCK_ABI_1_3)
/* dopt_component exactly as the ABI 1.2 / 1.3 headers laid it out (no
 * `devices`): the host must walk the array with this stride and read no
 * 1.4 field. */
typedef struct {
  size_t struct_size;
  void* ext;
  int32_t kind;
  const char *name, *version, *description;
  const dopt_option_spec* options;
  size_t num_options;
  const void* vtable;
  uint32_t traits;
  dopt_status (*check_job)(const dopt_job* job);
} component_v1_3;
DOPT_STATIC_ASSERT(sizeof(component_v1_3) == DOPT_COMPONENT_V1_2_STRUCT_SIZE, "1.3 layout");
DOPT_STATIC_ASSERT(sizeof(component_v1_3) < sizeof(dopt_component), "1.4 grew the component");
static const component_v1_3 k_components[] = {
    {sizeof(component_v1_3), NULL, DOPT_KIND_COMMUNICATOR, "mock_v13", "1.3.0",
     "an ABI 1.3 communicator", NULL, 0, &k_comm_vt, 0, NULL},
    {sizeof(component_v1_3), NULL, DOPT_KIND_REDUCER, "mock_v13", "1.3.0", "an ABI 1.3 reducer",
     NULL, 0, &k_red_vt, DOPT_TRAIT_EXACT_MEAN, NULL},
};
#define COMPONENTS ((const dopt_component*)(const void*)k_components)
#define NUM_COMPONENTS 2
#elif defined(MOCK_DEVICES)
static const dopt_component k_components[] = {
    {DOPT_COMPONENT_V1_4_STRUCT_SIZE, NULL, DOPT_KIND_COMMUNICATOR, "mock_cuda", "1.4.0",
     "device memory only", NULL, 0, &k_comm_vt, 0, NULL, DOPT_DEVICE_BIT(kDLCUDA)},
    {DOPT_COMPONENT_V1_4_STRUCT_SIZE, NULL, DOPT_KIND_REDUCER, "mock_cuda", "1.4.0",
     "host and device memory", NULL, 0, &k_red_vt, 0, NULL,
     DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA)},
};
#define COMPONENTS k_components
#define NUM_COMPONENTS 2
#elif defined(MOCK_NEWER_MINOR)
/* A plugin built against a future minor whose structs gained a field each:
 * the host must use struct_size as the array stride and ignore the extra. */
typedef struct {
  dopt_option_spec v1;
  const char* unit; /* appended in the imaginary 1.1 */
} spec_v1_1;
typedef struct {
  dopt_component v1;
  const char* homepage; /* appended in the imaginary 1.1 */
} component_v1_1;
static const spec_v1_1 k_minor_options[] = {
    {{sizeof(spec_v1_1), NULL, "alpha", DOPT_OPTION_INT, "2", 0, 5, NULL, "first", 0}, "items"},
    {{sizeof(spec_v1_1), NULL, "beta", DOPT_OPTION_STRING, "x", 0, -1, "x|y", "second", 0}, "none"},
};
static const component_v1_1 k_components[] = {
    {{sizeof(component_v1_1), NULL, DOPT_KIND_COMMUNICATOR, "mock_minor", "1.1.0", "newer minor",
      &k_minor_options[0].v1, 2, &k_comm_vt, 0, NULL},
     "https://example.invalid/a"},
    {{sizeof(component_v1_1), NULL, DOPT_KIND_REDUCER, "mock_minor", "1.1.0", "newer minor", NULL,
      0, &k_red_vt, 0, NULL},
     "https://example.invalid/b"},
};
#define COMPONENTS (&k_components[0].v1)
#define NUM_COMPONENTS 2
#else
static const dopt_component k_components[] = {
#if defined(MOCK_BAD_MAJOR)
    COMPONENT(DOPT_KIND_COMMUNICATOR, "mock_badmajor", NULL, 0, &k_comm_vt),
#elif defined(MOCK_NULL_FN)
    COMPONENT(DOPT_KIND_REDUCER, "mock_nullfn_ok", NULL, 0, &k_red_vt),
    COMPONENT(DOPT_KIND_COMMUNICATOR, "mock_nullfn", NULL, 0, &k_comm_vt),
#elif defined(MOCK_DUP)
    COMPONENT(DOPT_KIND_REDUCER, "mock_dup_only", NULL, 0, &k_red_vt),
    COMPONENT(DOPT_KIND_COMMUNICATOR, "mock", NULL, 0, &k_comm_vt),
#elif defined(MOCK_INIT_FAIL)
    COMPONENT(DOPT_KIND_COMMUNICATOR, "mock_initfail", NULL, 0, &k_comm_vt),
#elif defined(MOCK_BAD_DEFAULT)
    COMPONENT(DOPT_KIND_ALGORITHM, "mock_baddefault", k_bad_default_options, 1, &k_alg_vt),
#elif defined(MOCK_SMALL_STRUCT)
    {16, NULL, DOPT_KIND_COMMUNICATOR, "mock_small", "0.1.0", "truncated", NULL, 0, &k_comm_vt, 0,
     NULL},
#elif defined(MOCK_MISSING_DEP) || defined(MOCK_NO_ENTRY)
    COMPONENT(DOPT_KIND_COMMUNICATOR, MOCK_PREFIX, NULL, 0, &k_comm_vt),
#else
    COMPONENT(DOPT_KIND_COMMUNICATOR, "mock", NULL, 0, &k_comm_vt),
    COMPONENT_EX(DOPT_KIND_REDUCER, "mock", k_red_options, 4, &k_red_vt, DOPT_TRAIT_EXACT_MEAN,
                 NULL),
    COMPONENT_EX(DOPT_KIND_ALGORITHM, "mock", k_alg_options, 1, &k_alg_vt, 0, alg_check_job),
    COMPONENT_EX(DOPT_KIND_ALGORITHM, "mock_req", k_req_options, 1, &k_alg_vt, 0, req_check_job),
#endif
};
#define COMPONENTS k_components
#define NUM_COMPONENTS (sizeof k_components / sizeof k_components[0])
#endif

#ifdef MOCK_MISSING_DEP
int mock_dep_value(void); /* in libmock_dep.so, which the loader cannot find */
#endif

static dopt_status mock_init(const dopt_host_api* host, dopt_plugin_info* info) {
  g_host = host;
  if (host->struct_size < DOPT_HOST_API_STRUCT_SIZE) return DOPT_ERR_INVALID_ARGUMENT;
#ifdef MOCK_INIT_FAIL
  host->set_error("mock_initfail: the required device is not present");
  return DOPT_ERR_UNSUPPORTED;
#endif
#ifdef MOCK_MISSING_DEP
  if (mock_dep_value() != 42) return DOPT_ERR_INTERNAL;
#endif
  host->log(DOPT_LOG_DEBUG, MOCK_PREFIX, "mock plugin init");
#if defined(MOCK_BAD_MAJOR)
  info->abi_major = DOPT_ABI_VERSION_MAJOR + 1;
  info->abi_minor = 0;
#elif defined(MOCK_NEWER_MINOR)
  info->abi_major = DOPT_ABI_VERSION_MAJOR;
  info->abi_minor = DOPT_ABI_VERSION_MINOR + 1;
#elif defined(MOCK_ABI_1_1)
  info->abi_major = 1;
  info->abi_minor = 1;
#elif defined(MOCK_ABI_1_3)
  info->abi_major = 1;
  info->abi_minor = 3;
#else
  info->abi_major = DOPT_ABI_VERSION_MAJOR;
  info->abi_minor = DOPT_ABI_VERSION_MINOR;
#endif
  info->plugin_name = MOCK_PREFIX;
  info->plugin_version = "0.1.0";
  info->components = COMPONENTS;
  info->num_components = NUM_COMPONENTS;
  return DOPT_OK;
}

#ifdef MOCK_NO_ENTRY
/* The pre-versioning name: not what a v1 host looks for. */
DOPT_EXPORT dopt_status dopt_plugin_init(const dopt_host_api* host, dopt_plugin_info* info) {
  return mock_init(host, info);
}
#else
DOPT_EXPORT dopt_status dopt_plugin_init_v1(const dopt_host_api* host, dopt_plugin_info* info) {
  return mock_init(host, info);
}
#endif
