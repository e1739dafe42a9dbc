// A fixture that DOES use std::filesystem, compiled only at test time by
// check_symbols_selftest.sh (never by the build, so that the build tree stays
// clean): check_symbols.sh must name it, and with the poison stand-in
// preloaded, running it must reach the poisoned remove_all.
#include <filesystem>
#include <string>

int main(int argc, char** argv) {
  const std::filesystem::path p = argc > 1 ? argv[1] : "/nonexistent/distopt-selftest";
  return static_cast<int>(std::filesystem::remove_all(p) > 0);
}
