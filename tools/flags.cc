#include "tools/flags.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "frontend/ir/status.h"

namespace onnxpipe::tools {

FlagSet::FlagSet(std::string command, std::string usage, std::string description)
    : command_(std::move(command)), usage_(std::move(usage)), description_(std::move(description)) {}

void FlagSet::String(const std::string& name, std::string* out, const std::string& help) {
  flags_[name] = {Kind::kString, out, help, out->empty() ? "" : *out};
  order_.push_back(name);
}
void FlagSet::Int(const std::string& name, int64_t* out, const std::string& help) {
  flags_[name] = {Kind::kInt, out, help, std::to_string(*out)};
  order_.push_back(name);
}
void FlagSet::Double(const std::string& name, double* out, const std::string& help) {
  std::ostringstream os;
  os << *out;
  flags_[name] = {Kind::kDouble, out, help, os.str()};
  order_.push_back(name);
}
void FlagSet::Bool(const std::string& name, bool* out, const std::string& help) {
  flags_[name] = {Kind::kBool, out, help, *out ? "true" : "false"};
  order_.push_back(name);
}

void FlagSet::OptionalString(const std::string& name, std::string* out, const std::string& implicit,
                             const std::vector<std::string>& values, const std::string& help) {
  flags_[name] = {Kind::kOptionalString, out, help, out->empty() ? "" : *out, implicit, values};
  order_.push_back(name);
}

absl::Status FlagSet::Assign(const std::string& name, Flag& f, const std::string& value) {
  const std::string where = "onnxpipe " + command_ + ": flag --" + name;
  switch (f.kind) {
    case Kind::kString:
    case Kind::kOptionalString:
      *static_cast<std::string*>(f.target) = value;
      break;
    case Kind::kInt: {
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno == ERANGE)
        return INVALID_ARGUMENT() << where << " expects an integer, got '" << value << "'";
      *static_cast<int64_t*>(f.target) = v;
      break;
    }
    case Kind::kDouble: {
      char* end = nullptr;
      errno = 0;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || errno == ERANGE)
        return INVALID_ARGUMENT() << where << " expects a number, got '" << value << "'";
      *static_cast<double*>(f.target) = v;
      break;
    }
    case Kind::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(f.target) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(f.target) = false;
      } else {
        return INVALID_ARGUMENT() << where << " expects true or false, got '" << value << "'";
      }
      break;
  }
  set_[name] = true;
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.size() < 3 || a.rfind("--", 0) != 0) {
      if (!a.empty() && a[0] == '-' && a != "-")
        return INVALID_ARGUMENT() << "onnxpipe " << command_ << ": unknown option '" << a
                                  << "' (see onnxpipe " << command_ << " --help)";
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end() && !has_value && name.rfind("no-", 0) == 0) {
      auto neg = flags_.find(name.substr(3));
      if (neg != flags_.end() && neg->second.kind == Kind::kBool) {
        RETURN_IF_ERROR(Assign(neg->first, neg->second, "false"));
        continue;
      }
    }
    if (it == flags_.end())
      return INVALID_ARGUMENT() << "onnxpipe " << command_ << ": unknown flag --" << name
                                << " (see onnxpipe " << command_ << " --help)";
    if (!has_value) {
      const Flag& f = it->second;
      if (f.kind == Kind::kBool) {
        value = "true";
      } else if (f.kind == Kind::kOptionalString) {
        const bool next_is_value =
            i + 1 < args.size() && std::find(f.values.begin(), f.values.end(), args[i + 1]) != f.values.end();
        value = next_is_value ? args[++i] : f.implicit;
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return INVALID_ARGUMENT() << "onnxpipe " << command_ << ": flag --" << name
                                  << " needs a value";
      }
    }
    RETURN_IF_ERROR(Assign(name, it->second, value));
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::ostringstream os;
  os << "usage: onnxpipe " << command_ << " " << usage_ << "\n\n" << description_ << "\n\nflags:\n";
  for (const std::string& name : order_) {
    const Flag& f = flags_.at(name);
    std::string lhs = "  --" + name;
    if (f.kind == Kind::kOptionalString) {
      std::string choices;
      for (const std::string& v : f.values) choices += (choices.empty() ? "" : "|") + v;
      lhs += " [" + choices + "]";
    } else if (f.kind != Kind::kBool) {
      lhs += f.kind == Kind::kString ? " STR" : " N";
    }
    os << lhs;
    os << std::string(lhs.size() < 26 ? 26 - lhs.size() : 1, ' ') << f.help;
    if (!f.default_text.empty() && f.default_text != "0" && f.default_text != "false")
      os << " (default " << f.default_text << ")";
    os << "\n";
  }
  os << "  --help                  this text\n";
  return os.str();
}

}  // namespace onnxpipe::tools
