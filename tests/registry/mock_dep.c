/* A dependency of the MOCK_MISSING_DEP mock plugin, kept out of every search
 * path so that loading that plugin fails in the dynamic loader. */
__attribute__((visibility("default"))) int mock_dep_value(void) { return 42; }
