#include "communicator/fingerprint.hpp"

#include <cstdio>
#include <sstream>

namespace distopt::comm_check {

std::string dtype_name(DLDataType t) {
  const std::string bits = std::to_string(t.bits);
  switch (t.code) {
    case kDLFloat:
      return "float" + bits;
    case kDLBfloat:
      return "bfloat" + bits;
    case kDLInt:
      return "int" + bits;
    case kDLUInt:
      return "uint" + bits;
    default:
      return "dtype(" + std::to_string(t.code) + "," + bits + ")";
  }
}

std::string human_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

namespace {
const char* op_name(int32_t op) {
  switch (op) {
    case DOPT_REDUCE_SUM:
      return "sum";
    case DOPT_REDUCE_AVG:
      return "avg";
    case DOPT_REDUCE_MIN:
      return "min";
    case DOPT_REDUCE_MAX:
      return "max";
    default:
      return "?";
  }
}
}  // namespace

std::string Fingerprint::signature() const {
  std::ostringstream s;
  s << kind << ' ' << count << ' ' << int(dtype.code) << ' ' << int(dtype.bits) << ' '
    << int(dtype.lanes) << ' ' << root << ' ' << op;
  return s.str();
}

std::string Fingerprint::describe() const {
  std::string s = kind + " #" + std::to_string(kind_seq);
  if (kind != "barrier" && kind != "split") {
    const uint64_t bytes = static_cast<uint64_t>(count) * ((dtype.bits * dtype.lanes + 7) / 8);
    s += " of " + human_bytes(bytes) + " " + dtype_name(dtype);
  }
  if (op >= 0) s += std::string(" (") + op_name(op) + ")";
  if (root >= 0) s += " (root " + std::to_string(root) + ")";
  return s;
}

std::string Fingerprint::encode() const {
  std::ostringstream s;
  s << seq << ' ' << kind_seq << ' ' << signature();
  return s.str();
}

std::optional<Fingerprint> Fingerprint::decode(const std::string& line) {
  std::istringstream s(line);
  Fingerprint f;
  int code = 0, bits = 0, lanes = 0;
  if (!(s >> f.seq >> f.kind_seq >> f.kind >> f.count >> code >> bits >> lanes >> f.root >> f.op))
    return std::nullopt;
  f.dtype = {static_cast<uint8_t>(code), static_cast<uint8_t>(bits), static_cast<uint16_t>(lanes)};
  return f;
}

}  // namespace distopt::comm_check
