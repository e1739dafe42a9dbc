/*
 * A reducer plugin as an ABI 1.0 build would ship it: its vtable ends at
 * bytes_sent (struct_size = DOPT_REDUCER_V1_STRUCT_SIZE, no save_state /
 * load_state). It trains (world size 1: the local gradient is the mean), so
 * the test can show that such a plugin keeps working and that saving a
 * checkpoint with it fails with UNSUPPORTED naming the plugin file.
 */
#include <stdlib.h>

#include "distopt/reducer.h"

static const dopt_host_api* g_host;

struct dopt_reducer {
  int32_t world_size;
};
struct dopt_reduce_request {
  int done;
};

static dopt_status create(const dopt_create_args* a, dopt_comm_ref comm, const dopt_bucket* b,
                          size_t n, dopt_reducer** out) {
  (void)comm, (void)b, (void)n;
  if (a->world_size != 1) {
    g_host->set_error("abi10 reducer: only world size 1 (it does not communicate)");
    return DOPT_ERR_UNSUPPORTED;
  }
  *out = (dopt_reducer*)calloc(1, sizeof(dopt_reducer));
  return *out ? DOPT_OK : DOPT_ERR_NO_MEMORY;
}
static dopt_status destroy(dopt_reducer* r) {
  free(r);
  return DOPT_OK;
}
static dopt_status reduce(dopt_reducer* r, const dopt_bucket* b, dopt_reduce_request** q) {
  (void)r, (void)b;
  *q = (dopt_reduce_request*)calloc(1, sizeof(dopt_reduce_request));
  return *q ? DOPT_OK : DOPT_ERR_NO_MEMORY;
}
static dopt_status test(dopt_reduce_request* q, int32_t* done) {
  (void)q;
  *done = 1;
  return DOPT_OK;
}
static dopt_status wait(dopt_reduce_request* q, int64_t t) {
  (void)q, (void)t;
  return DOPT_OK;
}
static void request_free(dopt_reduce_request* q) { free(q); }
static uint64_t bytes_sent(const dopt_reducer* r) {
  (void)r;
  return 0;
}

/* Laid out exactly as ABI 1.0's dopt_reducer_v1 (the 1.1 fields are absent). */
typedef struct {
  size_t struct_size;
  void* ext;
  void* fns[7];
} reducer_v1_0;
static const reducer_v1_0 k_vtable = {DOPT_REDUCER_V1_STRUCT_SIZE,
                                      NULL,
                                      {(void*)create, (void*)destroy, (void*)reduce, (void*)test,
                                       (void*)wait, (void*)request_free, (void*)bytes_sent}};

/* Laid out exactly as ABI 1.0's dopt_component (1.2 appended traits and
 * check_job). */
typedef struct {
  size_t struct_size;
  void* ext;
  dopt_component_kind kind;
  const char *name, *version, *description;
  const dopt_option_spec* options;
  size_t num_options;
  const void* vtable;
} component_v1_0;
DOPT_STATIC_ASSERT(sizeof(component_v1_0) == DOPT_COMPONENT_STRUCT_SIZE, "1.0 component layout");
static const component_v1_0 k_components[] = {
    {DOPT_COMPONENT_STRUCT_SIZE, NULL, DOPT_KIND_REDUCER, "abi10_mean", "1.0.0",
     "an ABI 1.0 reducer (no checkpoint state)", NULL, 0, &k_vtable}};

DOPT_EXPORT dopt_status dopt_plugin_init_v1(const dopt_host_api* host, dopt_plugin_info* info) {
  g_host = host;
  info->abi_major = 1;
  info->abi_minor = 0;
  info->plugin_name = "abi10";
  info->plugin_version = "1.0.0";
  info->components = (const dopt_component*)(const void*)k_components;
  info->num_components = 1;
  return DOPT_OK;
}
