#include "engine/template/jinja.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/template/jinja_ast.h"
#include "engine/template/jinja_value.h"

namespace anchorage::jinja {

namespace {

[[noreturn]] void Throw(const std::string& message) { throw JinjaError(message); }

// Variables of one scope; the parent chain ends at the builtins.
struct Scope {
  ValueDict vars;
  std::shared_ptr<Scope> parent;
  const Value* Lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      if (const Value* v = s->vars.Find(name)) return v;
    }
    return nullptr;
  }
};

// ---- string helpers (Python str semantics on UTF-8) ----

std::string PyStrip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string cps = DecodeUtf8(s);
  std::u32string set;
  bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) {
    if (!chars.is_string()) Throw("strip arg must be None or str");
    set = DecodeUtf8(chars.as_string());
  }
  auto strip = [&](char32_t c) { return whitespace ? IsPySpace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return EncodeUtf8(cps.substr(b, e - b));
}

ValueList PySplit(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  ValueList out;
  if (sep.is_undefined() || sep.is_none()) {
    std::u32string cps = DecodeUtf8(s);
    std::vector<std::u32string> parts;
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < cps.size() && IsPySpace(cps[i])) ++i;
        if (i >= cps.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          size_t e = cps.size();
          while (e > i && IsPySpace(cps[e - 1])) --e;
          parts.push_back(cps.substr(i, e - i));
          break;
        }
        size_t j = i;
        while (j < cps.size() && !IsPySpace(cps[j])) ++j;
        parts.push_back(cps.substr(i, j - i));
        i = j;
      }
    } else {
      size_t e = cps.size();
      while (true) {
        while (e > 0 && IsPySpace(cps[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          size_t b = 0;
          while (b < e && IsPySpace(cps[b])) ++b;
          parts.push_back(cps.substr(b, e - b));
          break;
        }
        size_t j = e;
        while (j > 0 && !IsPySpace(cps[j - 1])) --j;
        parts.push_back(cps.substr(j, e - j));
        e = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
    for (auto& p : parts) out.push_back(Value::String(EncodeUtf8(p)));
    return out;
  }
  if (!sep.is_string()) Throw("must be str or None, not " + sep.TypeName());
  const std::string& d = sep.as_string();
  if (d.empty()) Throw("ValueError: empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
      size_t found = s.find(d, start);
      if (found == std::string::npos) break;
      parts.push_back(s.substr(start, found - start));
      start = found + d.size();
    }
    parts.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    while (true) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
      if (end < d.size()) break;
      size_t found = s.rfind(d, end - d.size());
      if (found == std::string::npos) break;
      parts.push_back(s.substr(found + d.size(), end - found - d.size()));
      end = found;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(Value::String(std::move(p)));
  return out;
}

std::string PyReplace(const std::string& s, const std::string& old_s, const std::string& new_s, int64_t count) {
  if (old_s.empty()) {
    std::u32string cps = DecodeUtf8(s);
    std::string out;
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      if (i < cps.size()) out += EncodeUtf8(std::u32string(1, cps[i]));
    }
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t found = s.find(old_s, pos);
    if (found == std::string::npos) break;
    out += s.substr(pos, found - pos) + new_s;
    pos = found + old_s.size();
    ++done;
  }
  return out + s.substr(pos);
}

int64_t PyCount(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(DecodeUtf8(s).size()) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while ((pos = s.find(sub, pos)) != std::string::npos) {
    ++n;
    pos += sub.size();
  }
  return n;
}

// Python str.splitlines() without keepends.
std::vector<std::string> PySplitLines(const std::string& s) {
  std::vector<std::string> out;
  std::u32string cps = DecodeUtf8(s);
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    char32_t c = cps[i];
    bool brk = c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
               c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    out.push_back(EncodeUtf8(cps.substr(start, i - start)));
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) out.push_back(EncodeUtf8(cps.substr(start)));
  return out;
}

// Python str.title(): a cased character after an uncased one is uppercased, the others lowercased.
std::string PyTitleMethod(const std::string& s) {
  std::u32string out;
  bool prev_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    bool cased = IsCased(c);
    out.push_back(cased ? (prev_cased ? ToLowerCp(c) : ToUpperCp(c)) : c);
    prev_cased = cased;
  }
  return EncodeUtf8(out);
}

// Python str.capitalize(): first character uppercased, the rest lowercased.
std::string Capitalize(const std::string& s) {
  std::u32string cps = DecodeUtf8(PyLower(s));
  if (!cps.empty()) cps[0] = ToUpperCp(cps[0]);
  return EncodeUtf8(cps);
}

// jinja2's title filter: each chunk split at runs of "-", whitespace and opening brackets is capitalized.
std::string JinjaTitle(const std::string& s) {
  auto is_sep = [](char c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPySpace(c); };
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    bool sep = is_sep(s[i]);
    while (j < s.size() && is_sep(s[j]) == sep) ++j;
    std::u32string chunk = DecodeUtf8(s.substr(i, j - i));
    out += PyUpper(EncodeUtf8(chunk.substr(0, 1))) + PyLower(EncodeUtf8(chunk.substr(1)));
    i = j;
  }
  return out;
}

// Python slice index adjustment; returns the selected indices.
std::vector<int64_t> SliceIndices(int64_t length, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto as_index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) Throw("slice indices must be integers or None");
    return v.as_int();
  };
  int64_t step = as_index(step_v).value_or(1);
  if (step == 0) Throw("slice step cannot be zero");
  std::optional<int64_t> start_o = as_index(start_v), stop_o = as_index(stop_v);
  int64_t start, stop;
  if (step > 0) {
    start = start_o.value_or(0);
    stop = stop_o.value_or(length);
    if (start < 0) start = std::max<int64_t>(0, start + length);
    if (stop < 0) stop = std::max<int64_t>(0, stop + length);
    start = std::min(start, length);
    stop = std::min(stop, length);
  } else {
    start = start_o.value_or(length - 1);
    stop = stop_o.value_or(-length - 1);
    if (start < 0) start = std::max<int64_t>(-1, start + length);
    if (stop < 0) stop = std::max<int64_t>(-1, stop + length);
    start = std::min(start, length - 1);
    stop = std::min(stop, length - 1);
  }
  std::vector<int64_t> out;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) out.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) out.push_back(i);
  }
  return out;
}

[[noreturn]] void FailUndefined(const Value& v) {
  Throw(v.as_string().empty() ? std::string("value is undefined") : v.as_string());
}

int64_t ToInt(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  Throw(std::string(what) + " must be an integer, not " + v.TypeName());
}

// Python printf-style `format % args`.
Value PyPercentFormat(const std::string& fmt, const Value& args) {
  ValueList positional;
  const bool is_tuple = args.is_tuple();
  if (is_tuple) {
    positional = args.as_list();
  } else {
    positional.push_back(args);
  }
  const bool mapping_like = !is_tuple && (args.is_dict() || args.is_list() || args.is_undefined());
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) Throw("incomplete format");
    if (fmt[i] == '%') {
      out.push_back('%');
      continue;
    }
    Value arg;
    bool have_arg = false;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) Throw("incomplete format key");
      if (!args.is_dict()) Throw("format requires a mapping");
      const Value* found = args.as_dict().Find(fmt.substr(i + 1, close - i - 1));
      if (!found) Throw("KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
      arg = *found;
      have_arg = true;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::strchr("-+ 0#", fmt[i])) spec.push_back(fmt[i++]);
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) spec.push_back(fmt[i++]);
    if (i < fmt.size() && fmt[i] == '.') {
      spec.push_back(fmt[i++]);
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) spec.push_back(fmt[i++]);
    }
    while (i < fmt.size() && (fmt[i] == 'l' || fmt[i] == 'h' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) Throw("incomplete format");
    const char conv = fmt[i];
    if (!have_arg) {
      if (next >= positional.size()) Throw("not enough arguments for format string");
      arg = positional[next++];
    }
    char buf[512];
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string text = conv == 's' ? arg.Str() : arg.Repr();
        if (spec == "%") {
          out += text;
        } else {
          bool left = spec.find('-') != std::string::npos;
          size_t digits_at = spec.find_first_of("123456789");
          size_t dot = spec.find('.');
          size_t width = digits_at != std::string::npos && (dot == std::string::npos || digits_at < dot)
                             ? std::stoul(spec.substr(digits_at))
                             : 0;
          std::u32string cps = DecodeUtf8(text);
          if (dot != std::string::npos) {
            size_t precision = dot + 1 < spec.size() ? std::stoul(spec.substr(dot + 1)) : 0;
            if (cps.size() > precision) cps.resize(precision);
          }
          std::string body = EncodeUtf8(cps);
          std::string pad = cps.size() < width ? std::string(width - cps.size(), ' ') : "";
          out += left ? body + pad : pad + body;
        }
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        if (!arg.is_number())
          Throw(std::string("%") + conv + " format: a real number is required, not " + arg.TypeName());
        long long value = arg.is_float() ? static_cast<long long>(arg.as_double()) : arg.as_int();
        char c = conv == 'i' || conv == 'u' ? 'd' : conv;
        std::snprintf(buf, sizeof(buf), (spec + "ll" + c).c_str(), value);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!arg.is_number()) Throw(std::string("must be real number, not ") + arg.TypeName());
        std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), arg.as_double());
        out += buf;
        break;
      }
      case 'c': {
        if (arg.is_string()) {
          out += arg.as_string();
        } else {
          out += EncodeUtf8(std::u32string(1, static_cast<char32_t>(ToInt(arg, "%c"))));
        }
        break;
      }
      default:
        Throw(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (next < positional.size() && !(next == 0 && mapping_like) && !args.is_dict()) {
    Throw("not all arguments converted during string formatting");
  }
  return Value::String(std::move(out));
}

std::shared_ptr<Callable> MakeFn(std::string name, std::function<Value(const CallArgs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return c;
}

class Interpreter {
 public:
  Interpreter(const RenderLimits& limits) : limits_(limits) {}

  std::string Run(const StmtList& body, const nlohmann::ordered_json& context) {
    auto builtins = std::make_shared<Scope>();
    InstallBuiltins(builtins->vars);
    auto root = std::make_shared<Scope>();
    root->parent = builtins;
    for (auto it = context.begin(); it != context.end(); ++it) root->vars.Set(it.key(), Value::FromJson(it.value()));
    std::string out;
    ExecList(body, root, out);
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  void Step() {
    if (++steps_ > limits_.max_steps) {
      throw JinjaError::Limit("render exceeded " + std::to_string(limits_.max_steps) + " steps (runaway loop?)");
    }
  }
  void CheckOutput(const std::string& out) {
    if (out.size() > limits_.max_output_bytes) {
      throw JinjaError::Limit("render output exceeded " + std::to_string(limits_.max_output_bytes) + " bytes");
    }
  }

  void InstallBuiltins(ValueDict& vars) {
    vars.Set("range", Value::Function(MakeFn("range", [this](const CallArgs& a) {
               int64_t start = 0, stop, step = 1;
               if (a.positional.size() == 1) {
                 stop = ToInt(a.positional[0], "range() argument");
               } else if (a.positional.size() == 2 || a.positional.size() == 3) {
                 start = ToInt(a.positional[0], "range() argument");
                 stop = ToInt(a.positional[1], "range() argument");
                 if (a.positional.size() == 3) step = ToInt(a.positional[2], "range() argument");
               } else {
                 Throw("range expected 1 to 3 arguments");
               }
               if (step == 0) Throw("range() arg 3 must not be zero");
               ValueList items;
               for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                 if (static_cast<int64_t>(items.size()) >= limits_.max_range_items) {
                   throw JinjaError::Limit("range() longer than " + std::to_string(limits_.max_range_items) + " items");
                 }
                 items.push_back(Value::Int(i));
               }
               return Value::List(std::move(items));
             })));
    vars.Set("namespace", Value::Function(MakeFn("namespace", [](const CallArgs& a) {
               auto attrs = std::make_shared<ValueDict>();
               for (const auto& p : a.positional) {
                 if (!p.is_dict()) Throw("namespace() positional argument must be a mapping");
                 for (const auto& kv : p.as_dict().items) attrs->Set(kv.first, kv.second);
               }
               for (const auto& kv : a.keyword) attrs->Set(kv.first, kv.second);
               return Value::Namespace(attrs);
             })));
    vars.Set("dict", Value::Function(MakeFn("dict", [](const CallArgs& a) {
               auto d = std::make_shared<ValueDict>();
               for (const auto& p : a.positional) {
                 if (!p.is_dict()) Throw("dict() positional argument must be a mapping");
                 for (const auto& kv : p.as_dict().items) d->Set(kv.first, kv.second);
               }
               for (const auto& kv : a.keyword) d->Set(kv.first, kv.second);
               return Value::Dict(d);
             })));
    vars.Set("raise_exception", Value::Function(MakeFn("raise_exception", [](const CallArgs& a) -> Value {
               throw JinjaError::Raised(a.Get(0, "message").Str());
             })));
    vars.Set("strftime_now", Value::Function(MakeFn("strftime_now", [](const CallArgs& a) {
               std::string fmt = a.Get(0, "format").Str();
               std::time_t now = std::time(nullptr);
               std::tm tm_now{};
               localtime_r(&now, &tm_now);
               char buf[512];
               size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm_now);
               return Value::String(std::string(buf, n));
             })));
  }

  // ---- statements ----

  Flow ExecList(const StmtList& list, const std::shared_ptr<Scope>& scope, std::string& out) {
    for (const auto& s : list) {
      Flow f = Exec(*s, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow Exec(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
    Step();
    try {
      return ExecInner(s, scope, out);
    } catch (JinjaError& e) {
      if (e.has_location()) throw;
      throw JinjaError(e.what(), s.line, s.column, e.kind());
    }
  }

  Flow ExecInner(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out += s.text;
        CheckOutput(out);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out += Eval(*s.expr, scope).Str();
        CheckOutput(out);
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (Eval(*s.conditions[i], scope).Truthy()) return ExecList(s.bodies[i], scope, out);
        }
        return ExecList(s.else_body, scope, out);
      case Stmt::Kind::kFor:
        ExecFor(s, scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet: {
        Value v = Eval(*s.expr, scope);
        if (!s.target_object.empty()) {
          const Value* target = scope->Lookup(s.target_object);
          if (!target || !target->is_namespace()) {
            Throw("cannot assign attribute on non-namespace object '" + s.target_object + "'");
          }
          target->as_dict().Set(s.target_attr, std::move(v));
        } else {
          Assign(s.targets, v, *scope);
        }
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        ExecList(s.body, scope, captured);
        Value v = Value::String(std::move(captured));
        for (const auto& f : s.filters) v = ApplyFilterExpr(*f, v, scope);
        scope->vars.Set(s.targets[0], v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string captured;
        ExecList(s.body, scope, captured);
        Value v = Value::String(std::move(captured));
        for (const auto& f : s.filters) v = ApplyFilterExpr(*f, v, scope);
        out += v.Str();
        CheckOutput(out);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope->vars.Set(s.name, MakeMacro(s, s.name, scope));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        const Expr& call = *s.expr;
        Value callee = Eval(*call.object, scope);
        CallArgs args = EvalArgs(call, scope);
        args.keyword.emplace_back("caller", MakeMacro(s, "caller", scope));
        out += CallValue(callee, args).Str();
        CheckOutput(out);
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void Assign(const std::vector<std::string>& targets, const Value& v, Scope& scope) {
    if (targets.size() == 1) {
      scope.vars.Set(targets[0], v);
      return;
    }
    ValueList items = v.Iterate();
    if (items.size() != targets.size()) {
      Throw(items.size() < targets.size()
                ? "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                      std::to_string(items.size()) + ")"
                : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.vars.Set(targets[i], items[i]);
  }

  void ExecFor(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
    Value iterable = Eval(*s.expr, scope);
    if (iterable.is_none()) Throw("'NoneType' object is not iterable");
    ValueList items = iterable.Iterate();
    auto loop_scope = std::make_shared<Scope>();
    loop_scope->parent = scope;
    if (s.condition) {
      ValueList kept;
      for (const auto& item : items) {
        Step();
        Assign(s.targets, item, *loop_scope);
        if (Eval(*s.condition, loop_scope).Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Step();
      auto iteration_scope = std::make_shared<Scope>();
      iteration_scope->parent = scope;
      Assign(s.targets, items[i], *iteration_scope);
      auto loop = std::make_shared<ValueDict>();
      loop->Set("index", Value::Int(i + 1));
      loop->Set("index0", Value::Int(i));
      loop->Set("revindex", Value::Int(n - i));
      loop->Set("revindex0", Value::Int(n - i - 1));
      loop->Set("first", Value::Bool(i == 0));
      loop->Set("last", Value::Bool(i == n - 1));
      loop->Set("length", Value::Int(n));
      loop->Set("depth", Value::Int(1));
      loop->Set("depth0", Value::Int(0));
      if (i > 0) loop->Set("previtem", items[i - 1]);
      if (i + 1 < n) loop->Set("nextitem", items[i + 1]);
      loop->Set("cycle", Value::Function(MakeFn("cycle", [i](const CallArgs& a) {
                  if (a.positional.empty()) Throw("no items for cycling given");
                  return a.positional[static_cast<size_t>(i) % a.positional.size()];
                })));
      iteration_scope->vars.Set("loop", Value::Dict(loop));
      Flow f = ExecList(s.body, iteration_scope, out);
      if (f == Flow::kBreak) break;
    }
    if (n == 0) ExecList(s.else_body, scope, out);
  }

  Value MakeMacro(const Stmt& s, const std::string& name, const std::shared_ptr<Scope>& defining_scope) {
    const Stmt* stmt = &s;
    // Weak: the macro lives in its defining scope's variables, and a strong pointer back would keep both forever.
    std::weak_ptr<Scope> closure = defining_scope;
    return Value::Function(MakeFn(name, [this, stmt, closure, name](const CallArgs& a) {
      if (++call_depth_ > limits_.max_call_depth) {
        --call_depth_;
        throw JinjaError::Limit("macro calls nested deeper than " + std::to_string(limits_.max_call_depth) +
                                " (runaway recursion?)");
      }
      struct DepthRestore {
        int* depth;
        ~DepthRestore() { --*depth; }
      } restore{&call_depth_};
      auto local = std::make_shared<Scope>();
      local->parent = closure.lock();
      if (local->parent == nullptr) Throw("macro '" + name + "' called after the block that defined it ended");
      if (a.positional.size() > stmt->params.size()) {
        Throw("macro '" + name + "' takes not more than " + std::to_string(stmt->params.size()) + " argument(s)");
      }
      for (size_t i = 0; i < stmt->params.size(); ++i) {
        const std::string& p = stmt->params[i];
        if (i < a.positional.size()) {
          local->vars.Set(p, a.positional[i]);
          continue;
        }
        bool found = false;
        for (const auto& kv : a.keyword) {
          if (kv.first == p) {
            local->vars.Set(p, kv.second);
            found = true;
          }
        }
        if (!found) {
          local->vars.Set(
              p, stmt->defaults[i] ? Eval(*stmt->defaults[i], local) : Value::Undefined("'" + p + "' is undefined"));
        }
      }
      for (const auto& kv : a.keyword) {
        if (kv.first == "caller") {
          local->vars.Set("caller", kv.second);
        } else if (std::find(stmt->params.begin(), stmt->params.end(), kv.first) == stmt->params.end()) {
          Throw("macro '" + name + "' takes no keyword argument '" + kv.first + "'");
        }
      }
      std::string out;
      ExecList(stmt->body, local, out);
      return Value::String(std::move(out));
    }));
  }

  // ---- expressions ----

  Value Eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
    struct DepthGuard {
      explicit DepthGuard(int* d) : depth(d) {
        if (++*depth > kMaxEvalDepth) {
          --*depth;
          throw JinjaError::Limit("expression nested deeper than " + std::to_string(kMaxEvalDepth));
        }
      }
      ~DepthGuard() { --*depth; }
      int* depth;
    } guard(&eval_depth_);
    return EvalInner(e, scope);
  }

  Value EvalInner(const Expr& e, const std::shared_ptr<Scope>& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        const Value* v = scope->Lookup(e.name);
        return v ? *v : Value::Undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const auto& i : e.items) items.push_back(Eval(*i, scope));
        return Value::List(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        auto d = std::make_shared<ValueDict>();
        for (size_t i = 0; i < e.items.size(); ++i) {
          Value k = Eval(*e.items[i], scope);
          if (!k.is_string()) Throw("unsupported: dict literal keys must be strings");
          d->Set(k.as_string(), Eval(*e.values[i], scope));
        }
        return Value::Dict(d);
      }
      case Expr::Kind::kAttr:
        return GetAttr(Eval(*e.object, scope), e.name);
      case Expr::Kind::kSubscript:
        return GetItem(Eval(*e.object, scope), Eval(*e.items[0], scope));
      case Expr::Kind::kSlice: {
        Value obj = Eval(*e.object, scope);
        Value start = e.items[0] ? Eval(*e.items[0], scope) : Value::None();
        Value stop = e.items[1] ? Eval(*e.items[1], scope) : Value::None();
        Value step = e.items[2] ? Eval(*e.items[2], scope) : Value::None();
        if (obj.is_undefined()) FailUndefined(obj);
        if (obj.is_list()) {
          ValueList out;
          for (int64_t i : SliceIndices(static_cast<int64_t>(obj.as_list().size()), start, stop, step)) {
            out.push_back(obj.as_list()[static_cast<size_t>(i)]);
          }
          return Value::List(std::move(out), obj.is_tuple());
        }
        if (obj.is_string()) {
          std::u32string cps = DecodeUtf8(obj.as_string());
          std::u32string out;
          for (int64_t i : SliceIndices(static_cast<int64_t>(cps.size()), start, stop, step)) {
            out.push_back(cps[static_cast<size_t>(i)]);
          }
          return Value::String(EncodeUtf8(out));
        }
        Throw("'" + obj.TypeName() + "' object is not subscriptable");
      }
      case Expr::Kind::kCall: {
        Value callee = Eval(*e.object, scope);
        CallArgs args = EvalArgs(e, scope);
        return CallValue(callee, args);
      }
      case Expr::Kind::kFilter:
        return ApplyFilterExpr(e, Eval(*e.object, scope), scope);
      case Expr::Kind::kTest: {
        Value v = Eval(*e.object, scope);
        CallArgs args = EvalArgs(e, scope);
        bool r = ApplyTest(e.name, v, args);
        return Value::Bool(e.negated ? !r : r);
      }
      case Expr::Kind::kUnary: {
        Value v = Eval(*e.object, scope);
        if (e.op == "not") return Value::Bool(!v.Truthy());
        if (v.is_undefined()) FailUndefined(v);
        if (!v.is_number()) Throw("bad operand type for unary " + e.op + ": '" + v.TypeName() + "'");
        if (e.op == "+") return v.is_float() ? v : Value::Int(v.as_int());
        return v.is_float() ? Value::Float(-v.as_double()) : Value::Int(-v.as_int());
      }
      case Expr::Kind::kBinary: {
        if (e.op == "and") {
          Value l = Eval(*e.items[0], scope);
          return l.Truthy() ? Eval(*e.items[1], scope) : l;
        }
        if (e.op == "or") {
          Value l = Eval(*e.items[0], scope);
          return l.Truthy() ? l : Eval(*e.items[1], scope);
        }
        Value l = Eval(*e.items[0], scope);
        Value r = Eval(*e.items[1], scope);
        return BinaryOp(e.op, l, r);
      }
      case Expr::Kind::kCompare: {
        Value l = Eval(*e.object, scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value r = Eval(*e.items[i], scope);
          if (!CompareOp(e.ops[i], l, r)) return Value::Bool(false);
          l = std::move(r);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCondition: {
        if (Eval(*e.items[1], scope).Truthy()) return Eval(*e.items[0], scope);
        if (e.items[2]) return Eval(*e.items[2], scope);
        return Value::Undefined("the inline if-expression evaluated to false and no else section was defined");
      }
    }
    return Value();
  }

  CallArgs EvalArgs(const Expr& e, const std::shared_ptr<Scope>& scope) {
    CallArgs args;
    for (const auto& a : e.items) args.positional.push_back(Eval(*a, scope));
    for (const auto& kv : e.kwargs) args.keyword.emplace_back(kv.first, Eval(*kv.second, scope));
    return args;
  }

  Value CallValue(const Value& callee, const CallArgs& args) {
    if (callee.is_undefined()) FailUndefined(callee);
    if (!callee.is_callable()) Throw("'" + callee.TypeName() + "' object is not callable");
    return callee.as_callable().fn(args);
  }

  static bool Contains(const Value& container, const Value& item) {
    switch (container.kind()) {
      case Value::Kind::kString:
        if (!item.is_string()) {
          Throw("'in <string>' requires string as left operand, not " + item.TypeName());
        }
        return container.as_string().find(item.as_string()) != std::string::npos;
      case Value::Kind::kList:
        for (const auto& v : container.as_list()) {
          if (PyEquals(v, item)) return true;
        }
        return false;
      case Value::Kind::kDict:
        if ((item.is_list() && !item.is_tuple()) || item.is_dict()) {
          Throw("unhashable type: '" + item.TypeName() + "'");
        }
        return item.is_string() && container.as_dict().Find(item.as_string()) != nullptr;
      case Value::Kind::kGenerator:
        for (const auto& v : container.Iterate()) {
          if (PyEquals(v, item)) return true;
        }
        return false;
      case Value::Kind::kUndefined:
        return false;
      default:
        Throw("argument of type '" + container.TypeName() + "' is not iterable");
    }
  }

  static bool CompareOp(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return PyEquals(l, r);
    if (op == "!=") return !PyEquals(l, r);
    if (op == "in") return Contains(r, l);
    if (op == "notin") return !Contains(r, l);
    if (l.is_undefined()) FailUndefined(l);
    if (r.is_undefined()) FailUndefined(r);
    int c = PyCompare(l, r);
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  static Value BinaryOp(const std::string& op, const Value& l, const Value& r) {
    if (op == "~") return Value::String(l.Str() + r.Str());
    if (op == "%" && l.is_string()) return PyPercentFormat(l.as_string(), r);
    if (l.is_undefined()) FailUndefined(l);
    if (r.is_undefined()) FailUndefined(r);
    auto type_error = [&]() -> Value {
      Throw("unsupported operand type(s) for " + op + ": '" + l.TypeName() + "' and '" + r.TypeName() + "'");
    };
    if (op == "+") {
      if (l.is_string() && r.is_string()) return Value::String(l.as_string() + r.as_string());
      if (l.is_list() && r.is_list() && l.is_tuple() == r.is_tuple()) {
        ValueList out = l.as_list();
        out.insert(out.end(), r.as_list().begin(), r.as_list().end());
        return Value::List(std::move(out), l.is_tuple());
      }
    }
    if (op == "*") {
      const Value* seq = l.is_string() || l.is_list() ? &l : (r.is_string() || r.is_list() ? &r : nullptr);
      const Value* times = seq == &l ? &r : &l;
      if (seq && (times->is_int() || times->is_bool())) {
        int64_t n = std::max<int64_t>(0, times->as_int());
        if (n * static_cast<int64_t>(seq->is_string() ? seq->as_string().size() + 1 : seq->as_list().size() + 1) >
            (64 << 20)) {
          Throw("repetition result too large");
        }
        if (seq->is_string()) {
          std::string out;
          for (int64_t i = 0; i < n; ++i) out += seq->as_string();
          return Value::String(std::move(out));
        }
        ValueList out;
        for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->as_list().begin(), seq->as_list().end());
        return Value::List(std::move(out), seq->is_tuple());
      }
    }
    if (!l.is_number() || !r.is_number()) return type_error();
    bool use_float = l.is_float() || r.is_float();
    if (op == "/") {
      if (r.as_double() == 0.0) Throw("division by zero");
      return Value::Float(l.as_double() / r.as_double());
    }
    if (op == "**") {
      if (!use_float && r.as_int() >= 0) {
        int64_t base = l.as_int(), exp = r.as_int(), result = 1;
        for (int64_t i = 0; i < exp; ++i) {
          if (__builtin_mul_overflow(result, base, &result)) Throw("integer overflow in **");
        }
        return Value::Int(result);
      }
      return Value::Float(std::pow(l.as_double(), r.as_double()));
    }
    if (use_float) {
      double a = l.as_double(), b = r.as_double();
      if (op == "+") return Value::Float(a + b);
      if (op == "-") return Value::Float(a - b);
      if (op == "*") return Value::Float(a * b);
      if (b == 0.0) Throw("float division by zero");
      if (op == "//") return Value::Float(std::floor(a / b));
      if (op == "%") {
        double m = std::fmod(a, b);
        if (m != 0.0 && ((m < 0) != (b < 0))) m += b;
        if (m == 0.0) m = std::copysign(0.0, b);
        return Value::Float(m);
      }
      return type_error();
    }
    int64_t a = l.as_int(), b = r.as_int(), out;
    if (op == "+") {
      if (__builtin_add_overflow(a, b, &out)) Throw("integer overflow");
      return Value::Int(out);
    }
    if (op == "-") {
      if (__builtin_sub_overflow(a, b, &out)) Throw("integer overflow");
      return Value::Int(out);
    }
    if (op == "*") {
      if (__builtin_mul_overflow(a, b, &out)) Throw("integer overflow");
      return Value::Int(out);
    }
    if (b == 0) Throw("integer division or modulo by zero");
    int64_t q = a / b, m = a % b;
    if (m != 0 && ((m < 0) != (b < 0))) {
      q -= 1;
      m += b;
    }
    if (op == "//") return Value::Int(q);
    if (op == "%") return Value::Int(m);
    return type_error();
  }

  // ---- attribute and item access (jinja2 sandbox semantics) ----

  Value GetAttr(const Value& obj, const std::string& name) {
    switch (obj.kind()) {
      case Value::Kind::kUndefined:
        FailUndefined(obj);
      case Value::Kind::kDict: {
        Value method = DictMethod(obj, name);
        if (!method.is_undefined()) return method;
        if (const Value* v = obj.as_dict().Find(name)) return *v;
        return Value::Undefined("'dict object' has no attribute '" + name + "'");
      }
      case Value::Kind::kNamespace:
        if (const Value* v = obj.as_dict().Find(name)) return *v;
        return Value::Undefined("'Namespace' object has no attribute '" + name + "'");
      case Value::Kind::kString: {
        Value method = StringMethod(obj, name);
        if (!method.is_undefined()) return method;
        return Value::Undefined("'str object' has no attribute '" + name + "'");
      }
      default:
        return Value::Undefined("'" + obj.TypeName() + " object' has no attribute '" + name + "'");
    }
  }

  Value GetItem(const Value& obj, const Value& key) {
    switch (obj.kind()) {
      case Value::Kind::kUndefined:
        FailUndefined(obj);
      case Value::Kind::kDict:
        if (key.is_string()) {
          if (const Value* v = obj.as_dict().Find(key.as_string())) return *v;
          Value method = DictMethod(obj, key.as_string());
          if (!method.is_undefined()) return method;
        }
        return Value::Undefined("'dict object' has no attribute '" + key.Str() + "'");
      case Value::Kind::kList:
      case Value::Kind::kString: {
        if (key.is_int() || key.is_bool()) {
          int64_t i = key.as_int();
          if (obj.is_list()) {
            int64_t n = static_cast<int64_t>(obj.as_list().size());
            if (i < 0) i += n;
            if (i >= 0 && i < n) return obj.as_list()[static_cast<size_t>(i)];
          } else {
            std::u32string cps = DecodeUtf8(obj.as_string());
            int64_t n = static_cast<int64_t>(cps.size());
            if (i < 0) i += n;
            if (i >= 0 && i < n) return Value::String(EncodeUtf8(std::u32string(1, cps[static_cast<size_t>(i)])));
          }
          return Value::Undefined("index " + std::to_string(key.as_int()) + " out of range");
        }
        if (key.is_string()) return GetAttr(obj, key.as_string());
        return Value::Undefined("bad index type " + key.TypeName());
      }
      case Value::Kind::kNamespace:
        if (key.is_string()) return GetAttr(obj, key.as_string());
        return Value::Undefined("bad index");
      default:
        return Value::Undefined("'" + obj.TypeName() + " object' has no attribute '" + key.Str() + "'");
    }
  }

  static Value DictMethod(const Value& obj, const std::string& name) {
    std::shared_ptr<ValueDict> d = obj.dict_ptr();
    if (name == "items") {
      return Value::Function(MakeFn("items", [d](const CallArgs&) {
        ValueList out;
        for (const auto& kv : d->items) out.push_back(Value::List({Value::String(kv.first), kv.second}, true));
        return Value::List(std::move(out));
      }));
    }
    if (name == "keys") {
      return Value::Function(MakeFn("keys", [d](const CallArgs&) {
        ValueList out;
        for (const auto& kv : d->items) out.push_back(Value::String(kv.first));
        return Value::List(std::move(out));
      }));
    }
    if (name == "values") {
      return Value::Function(MakeFn("values", [d](const CallArgs&) {
        ValueList out;
        for (const auto& kv : d->items) out.push_back(kv.second);
        return Value::List(std::move(out));
      }));
    }
    if (name == "get") {
      return Value::Function(MakeFn("get", [d](const CallArgs& a) {
        Value key = a.Get(0, "key");
        Value fallback = a.Get(1, "default", Value::None());
        if (key.is_string()) {
          if (const Value* v = d->Find(key.as_string())) return *v;
        }
        return fallback;
      }));
    }
    static const char* kUnsafe[] = {"pop", "popitem", "update", "setdefault", "clear", "copy"};
    for (const char* u : kUnsafe) {
      if (name == u) {
        std::string n = name;
        return Value::Function(MakeFn(n, [n](const CallArgs&) -> Value {
          Throw("unsupported: dict." + n + "() (the sandbox keeps values immutable)");
        }));
      }
    }
    return Value();
  }

  static Value StringMethod(const Value& obj, const std::string& name) {
    std::string s = obj.as_string();
    auto fn = [&](std::function<Value(const CallArgs&)> f) { return Value::Function(MakeFn(name, std::move(f))); };
    if (name == "startswith" || name == "endswith") {
      bool starts = name == "startswith";
      return fn([s, starts](const CallArgs& a) {
        Value p = a.Get(0, "prefix");
        ValueList options = p.is_tuple() ? p.as_list() : ValueList{p};
        for (const auto& o : options) {
          if (!o.is_string()) Throw("startswith/endswith argument must be str or a tuple of str");
          const std::string& x = o.as_string();
          if (x.size() > s.size()) continue;
          if (starts ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0) {
            return Value::Bool(true);
          }
        }
        return Value::Bool(false);
      });
    }
    if (name == "split" || name == "rsplit") {
      bool right = name == "rsplit";
      return fn([s, right](const CallArgs& a) {
        Value sep = a.Get(0, "sep", Value::None());
        int64_t maxsplit = ToInt(a.Get(1, "maxsplit", Value::Int(-1)), "maxsplit");
        return Value::List(PySplit(s, sep, maxsplit, right));
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool left = name != "rstrip", right = name != "lstrip";
      return fn([s, left, right](const CallArgs& a) {
        return Value::String(PyStrip(s, a.Get(0, "chars", Value::None()), left, right));
      });
    }
    if (name == "upper") return fn([s](const CallArgs&) { return Value::String(PyUpper(s)); });
    if (name == "lower") return fn([s](const CallArgs&) { return Value::String(PyLower(s)); });
    if (name == "title") return fn([s](const CallArgs&) { return Value::String(PyTitleMethod(s)); });
    if (name == "capitalize") return fn([s](const CallArgs&) { return Value::String(Capitalize(s)); });
    if (name == "replace") {
      return fn([s](const CallArgs& a) {
        Value o = a.Get(0, "old"), n = a.Get(1, "new");
        if (!o.is_string() || !n.is_string()) Throw("replace() arguments must be str");
        int64_t count = ToInt(a.Get(2, "count", Value::Int(-1)), "count");
        return Value::String(PyReplace(s, o.as_string(), n.as_string(), count));
      });
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
      bool right = name[0] == 'r';
      bool raise = name.find("index") != std::string::npos;
      return fn([s, right, raise](const CallArgs& a) {
        Value sub = a.Get(0, "sub");
        if (!sub.is_string()) Throw("find() argument must be str");
        size_t pos = right ? s.rfind(sub.as_string()) : s.find(sub.as_string());
        if (pos == std::string::npos) {
          if (raise) Throw("ValueError: substring not found");
          return Value::Int(-1);
        }
        return Value::Int(static_cast<int64_t>(DecodeUtf8(s.substr(0, pos)).size()));
      });
    }
    if (name == "count") {
      return fn([s](const CallArgs& a) {
        Value sub = a.Get(0, "sub");
        if (!sub.is_string()) Throw("count() argument must be str");
        return Value::Int(PyCount(s, sub.as_string()));
      });
    }
    if (name == "join") {
      return fn([s](const CallArgs& a) {
        std::string out;
        bool first = true;
        for (const auto& v : a.Get(0, "iterable").Iterate()) {
          if (!v.is_string()) Throw("sequence item: expected str instance, " + v.TypeName() + " found");
          if (!first) out += s;
          first = false;
          out += v.as_string();
        }
        return Value::String(std::move(out));
      });
    }
    if (name == "splitlines") {
      return fn([s](const CallArgs&) {
        ValueList out;
        for (auto& line : PySplitLines(s)) out.push_back(Value::String(std::move(line)));
        return Value::List(std::move(out));
      });
    }
    auto all_of = [&](int (*pred)(int)) {
      return fn([s, pred](const CallArgs&) {
        if (s.empty()) return Value::Bool(false);
        for (unsigned char c : s) {
          if (!pred(c)) return Value::Bool(false);
        }
        return Value::Bool(true);
      });
    };
    if (name == "isdigit") return all_of(std::isdigit);
    if (name == "isalpha") return all_of(std::isalpha);
    if (name == "isalnum") return all_of(std::isalnum);
    if (name == "isspace") return all_of(std::isspace);
    return Value();
  }

  // ---- filters ----

  Value ApplyFilterExpr(const Expr& f, const Value& v, const std::shared_ptr<Scope>& scope) {
    CallArgs args = EvalArgs(f, scope);
    return ApplyFilter(f.name, v, args);
  }

  Value AttributePath(const Value& v, const Value& attribute) {
    if (attribute.is_int()) return GetItem(v, attribute);
    Value cur = v;
    for (const auto& part : PySplit(attribute.Str(), Value::String("."), -1, false)) {
      const std::string& p = part.as_string();
      bool numeric = !p.empty() && std::all_of(p.begin(), p.end(),
                                               [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      cur = numeric ? GetItem(cur, Value::Int(std::stoll(p))) : GetItem(cur, Value::String(p));
    }
    return cur;
  }

  static Value SortKey(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return Value::String(PyLower(v.as_string()));
    return v;
  }

  // Applies filter `name`; throws JinjaError for unknown filters and bad arguments.
  Value ApplyFilter(const std::string& name, const Value& v, const CallArgs& a) {
    if (name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr" ||
        name == "unique" || name == "batch" || name == "items") {
      // jinja2 yields these lazily: a failure surfaces only when the result is iterated.
      try {
        return MoreFilters(name, v, a);
      } catch (const JinjaError& e) {
        if (e.kind() != JinjaError::Kind::kError) throw;
        return Value::Generator({}, e.what());
      }
    }
    return EagerFilter(name, v, a);
  }

  Value EagerFilter(const std::string& name, const Value& v, const CallArgs& a) {
    if (name == "tojson") {
      Value ensure_ascii = a.Get(0, "ensure_ascii", Value::Bool(false));
      Value indent_v = a.Get(1, "indent", Value::None());
      Value separators = a.Get(2, "separators", Value::None());
      Value sort_keys = a.Get(3, "sort_keys", Value::Bool(false));
      int indent = -1;
      if (!indent_v.is_none()) indent = static_cast<int>(std::max<int64_t>(0, ToInt(indent_v, "tojson indent")));
      std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
      if (!separators.is_none()) {
        if (!separators.is_list() || separators.as_list().size() != 2) Throw("tojson separators must be a pair");
        item_sep = separators.as_list()[0].Str();
        key_sep = separators.as_list()[1].Str();
      }
      return Value::String(ToJson(v, indent, item_sep, key_sep, ensure_ascii.Truthy(), sort_keys.Truthy()));
    }
    if (name == "safe") return Value::String(v.Str());
    if (name == "trim") return Value::String(PyStrip(v.Str(), a.Get(0, "chars", Value::None()), true, true));
    if (name == "length" || name == "count") return Value::Int(v.Length());
    if (name == "string") return Value::String(v.Str());
    if (name == "list") return Value::List(v.Iterate());
    if (name == "first") {
      ValueList items = v.Iterate();
      return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items.front();
    }
    if (name == "last") {
      if (v.is_generator()) Throw("'generator' object is not reversible");
      ValueList items = v.Iterate();
      return items.empty() ? Value::Undefined("No last item, sequence was empty.") : items.back();
    }
    if (name == "join") {
      std::string sep = a.Get(0, "d", Value::String("")).Str();
      Value attribute = a.Get(1, "attribute", Value::None());
      std::string out;
      bool first = true;
      for (const auto& item : v.Iterate()) {
        if (!first) out += sep;
        first = false;
        out += (attribute.is_none() ? item : AttributePath(item, attribute)).Str();
      }
      return Value::String(std::move(out));
    }
    if (name == "default" || name == "d") {
      Value fallback = a.Get(0, "default_value", Value::String(""));
      bool boolean = a.Get(1, "boolean", Value::Bool(false)).Truthy();
      if (v.is_undefined() || (boolean && !v.Truthy())) return fallback;
      return v;
    }
    if (name == "upper") return Value::String(PyUpper(v.Str()));
    if (name == "lower") return Value::String(PyLower(v.Str()));
    if (name == "capitalize") return Value::String(Capitalize(v.Str()));
    if (name == "title") return Value::String(JinjaTitle(v.Str()));
    if (name == "replace") {
      int64_t count = a.Has(2, "count") ? ToInt(a.Get(2, "count"), "count") : -1;
      if (a.Get(2, "count").is_none()) count = -1;
      return Value::String(PyReplace(v.Str(), a.Get(0, "old").Str(), a.Get(1, "new").Str(), count));
    }
    if (name == "int") {
      if (v.is_undefined()) FailUndefined(v);
      Value fallback = a.Get(0, "default", Value::Int(0));
      if (v.is_int() || v.is_bool()) return Value::Int(v.as_int());
      if (v.is_float()) {
        if (!std::isfinite(v.as_double())) return fallback;
        return Value::Int(static_cast<int64_t>(v.as_double()));
      }
      if (v.is_string()) {
        std::string s = PyStrip(v.as_string(), Value::None(), true, true);
        char* end = nullptr;
        errno = 0;
        long long i = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end && *end == '\0' && errno == 0) return Value::Int(i);
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0' && std::isfinite(d)) return Value::Int(static_cast<int64_t>(d));
      }
      return fallback;
    }
    if (name == "float") {
      if (v.is_undefined()) FailUndefined(v);
      Value fallback = a.Get(0, "default", Value::Float(0.0));
      if (v.is_number()) return Value::Float(v.as_double());
      if (v.is_string()) {
        std::string s = PyStrip(v.as_string(), Value::None(), true, true);
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value::Float(d);
      }
      return fallback;
    }
    if (name == "abs") {
      if (v.is_float()) return Value::Float(std::fabs(v.as_double()));
      if (v.is_int() || v.is_bool()) return Value::Int(std::llabs(v.as_int()));
      Throw("bad operand type for abs(): '" + v.TypeName() + "'");
    }
    if (name == "round") {
      int64_t precision = ToInt(a.Get(0, "precision", Value::Int(0)), "precision");
      std::string method = a.Get(1, "method", Value::String("common")).Str();
      if (!v.is_number()) Throw("type " + v.TypeName() + " doesn't define __round__ method");
      double scale = std::pow(10.0, static_cast<double>(precision));
      if (method == "common") {
        if (!v.is_float() && precision >= 0) return Value::Int(v.as_int());
        return Value::Float(std::nearbyint(v.as_double() * scale) / scale);  // half to even, as Python's round()
      }
      if (method != "ceil" && method != "floor") Throw("method must be common, ceil or floor");
      double x = v.as_double() * scale;
      return Value::Float((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
    }
    return MoreFilters(name, v, a);
  }

  Value MoreFilters(const std::string& name, const Value& v, const CallArgs& a) {
    if (name == "items") {
      if (v.is_undefined()) return Value::Generator({});
      if (!v.is_dict()) Throw("Can only get item pairs from a mapping.");
      return Value::Generator(DictMethod(v, "items").as_callable().fn(CallArgs{}).as_list());
    }
    if (name == "map") {
      ValueList out;
      if (!v.Truthy()) return Value::Generator({});
      Value attribute = a.Get(99, "attribute");
      if (!attribute.is_undefined()) {
        Value fallback = a.Get(99, "default");
        for (const auto& item : v.Iterate()) {
          Value x = AttributePath(item, attribute);
          out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
        }
        return Value::Generator(std::move(out));
      }
      if (a.positional.empty()) Throw("map requires a filter name or attribute=");
      std::string filter = a.positional[0].Str();
      if (!IsKnownFilter(filter)) Throw("unsupported filter '" + filter + "'");
      CallArgs rest;
      rest.positional.assign(a.positional.begin() + 1, a.positional.end());
      rest.keyword = a.keyword;
      for (const auto& item : v.Iterate()) out.push_back(ApplyFilter(filter, item, rest));
      return Value::Generator(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      bool by_attr = name.find("attr") != std::string::npos;
      bool want = name.rfind("select", 0) == 0;
      size_t i = 0;
      Value attribute = by_attr ? a.Get(i++, "attribute") : Value();
      Value test = a.Get(i++, "test");
      CallArgs test_args;
      if (a.positional.size() > i) test_args.positional.assign(a.positional.begin() + i, a.positional.end());
      if (!test.is_undefined() && !IsKnownTest(test.Str())) Throw("unsupported test '" + test.Str() + "'");
      ValueList out;
      if (!v.Truthy()) return Value::Generator({});
      for (const auto& item : v.Iterate()) {
        Value x = by_attr ? AttributePath(item, attribute) : item;
        bool r = test.is_undefined() ? x.Truthy() : ApplyTest(test.Str(), x, test_args);
        if (r == want) out.push_back(item);
      }
      return Value::Generator(std::move(out));
    }
    if (name == "unique") {
      bool case_sensitive = a.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
      Value attribute = a.Get(1, "attribute", Value::None());
      ValueList out, seen;
      for (const auto& item : v.Iterate()) {
        Value key = SortKey(attribute.is_none() ? item : AttributePath(item, attribute), case_sensitive);
        if ((key.is_list() && !key.is_tuple()) || key.is_dict()) Throw("unhashable type: '" + key.TypeName() + "'");
        bool dup = false;
        for (const auto& s : seen) {
          if (PyEquals(s, key)) dup = true;
        }
        if (!dup) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return Value::Generator(std::move(out));
    }
    if (name == "reverse") {
      if (v.is_string()) {
        std::u32string cps = DecodeUtf8(v.as_string());
        std::reverse(cps.begin(), cps.end());
        return Value::String(EncodeUtf8(cps));
      }
      ValueList items = v.Iterate();
      std::reverse(items.begin(), items.end());
      return Value::Generator(std::move(items));
    }
    if (name == "sort" || name == "min" || name == "max") {
      bool is_sort = name == "sort";
      bool reverse = is_sort && a.Get(0, "reverse", Value::Bool(false)).Truthy();
      bool case_sensitive = a.Get(is_sort ? 1 : 0, "case_sensitive", Value::Bool(false)).Truthy();
      Value attribute = a.Get(is_sort ? 2 : 1, "attribute", Value::None());
      ValueList items = v.Iterate();
      auto key = [&](const Value& x) {
        return SortKey(attribute.is_none() ? x : AttributePath(x, attribute), case_sensitive);
      };
      if (!is_sort) {  // the first of equal extremes, as Python's min() and max() return
        if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
        Value best = items.front();
        for (size_t i = 1; i < items.size(); ++i) {
          int c = PyCompare(key(items[i]), key(best));
          if (name == "min" ? c < 0 : c > 0) best = items[i];
        }
        return best;
      }
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        return reverse ? PyCompare(key(y), key(x)) < 0 : PyCompare(key(x), key(y)) < 0;
      });
      return Value::List(std::move(items));
    }
    if (name == "sum") {
      Value attribute = a.Get(0, "attribute", Value::None());
      Value total = a.Get(1, "start", Value::Int(0));
      for (const auto& item : v.Iterate()) {
        total = BinaryOp("+", total, attribute.is_none() ? item : AttributePath(item, attribute));
      }
      return total;
    }
    if (name == "indent") {
      Value width_v = a.Get(0, "width", Value::Int(4));
      std::string pad = width_v.is_string() ? width_v.as_string() : std::string(ToInt(width_v, "width"), ' ');
      bool first = a.Get(1, "first", Value::Bool(false)).Truthy();
      bool blank = a.Get(2, "blank", Value::Bool(false)).Truthy();
      if (!v.is_string()) Throw("indent: can only indent a string, not " + v.TypeName());
      std::vector<std::string> lines = PySplitLines(v.as_string() + "\n");
      std::string out;
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i) out += "\n";
        if (i > 0 && (blank || !lines[i].empty())) out += pad;
        out += lines[i];
      }
      if (first) out = pad + out;
      return Value::String(std::move(out));
    }
    if (name == "dictsort") {
      if (!v.is_dict()) Throw("dictsort requires a mapping");
      bool case_sensitive = a.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
      bool by_value = a.Get(1, "by", Value::String("key")).Str() == "value";
      bool reverse = a.Get(2, "reverse", Value::Bool(false)).Truthy();
      ValueList items = DictMethod(v, "items").as_callable().fn(CallArgs{}).as_list();
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        Value kx = SortKey(x.as_list()[by_value ? 1 : 0], case_sensitive);
        Value ky = SortKey(y.as_list()[by_value ? 1 : 0], case_sensitive);
        return reverse ? PyCompare(ky, kx) < 0 : PyCompare(kx, ky) < 0;
      });
      return Value::List(std::move(items));
    }
    if (name == "wordcount") {  // runs of \w, as jinja2's regex counts them
      int64_t words = 0;
      bool in_word = false;
      for (char32_t c : DecodeUtf8(v.Str())) {
        bool w = c == '_' ||
                 (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : IsCased(c) || (c >= 0x4e00 && c <= 0x9fff));
        if (w && !in_word) ++words;
        in_word = w;
      }
      return Value::Int(words);
    }
    if (name == "center") {
      int64_t width = ToInt(a.Get(0, "width", Value::Int(80)), "width");
      std::u32string cps = DecodeUtf8(v.Str());
      int64_t n = static_cast<int64_t>(cps.size());
      if (width <= n) return Value::String(v.Str());
      int64_t total = width - n;
      int64_t left = total / 2 + (total & width & 1);
      return Value::String(std::string(left, ' ') + v.Str() + std::string(total - left, ' '));
    }
    if (name == "attr") return GetAttr(v, a.Get(0, "name").Str());
    if (name == "batch") {
      int64_t size = ToInt(a.Get(0, "linecount"), "linecount");
      if (size <= 0) Throw("batch size must be positive");
      Value fill = a.Get(1, "fill_with", Value::None());
      ValueList out, cur;
      for (const auto& item : v.Iterate()) {
        cur.push_back(item);
        if (static_cast<int64_t>(cur.size()) == size) {
          out.push_back(Value::List(std::move(cur)));
          cur.clear();
        }
      }
      if (!cur.empty()) {
        if (!fill.is_none()) {
          while (static_cast<int64_t>(cur.size()) < size) cur.push_back(fill);
        }
        out.push_back(Value::List(std::move(cur)));
      }
      return Value::Generator(std::move(out));
    }
    Throw("unsupported filter '" + name + "'");
  }

  // ---- tests ----

  bool ApplyTest(const std::string& name, const Value& v, const CallArgs& a) {
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "iterable") return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string() || v.is_generator();
    if (name == "sequence") return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string();
    if (name == "number") return v.is_number();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "callable") return v.is_callable() || v.is_undefined();
    if (name == "lower" || name == "upper") {
      std::string s = v.Str();
      return name == "lower" ? PyLower(s) == s && PyUpper(s) != s : PyUpper(s) == s && PyLower(s) != s;
    }
    if (name == "even") return PyEquals(BinaryOp("%", v, Value::Int(2)), Value::Int(0));
    if (name == "odd") return PyEquals(BinaryOp("%", v, Value::Int(2)), Value::Int(1));
    if (name == "divisibleby") return PyEquals(BinaryOp("%", v, a.Get(0, "num")), Value::Int(0));
    Value other = a.Get(0, "other");
    if (name == "eq" || name == "equalto") return CompareOp("==", v, other);
    if (name == "ne") return CompareOp("!=", v, other);
    if (name == "gt" || name == "greaterthan") return CompareOp(">", v, other);
    if (name == "lt" || name == "lessthan") return CompareOp("<", v, other);
    if (name == "ge") return CompareOp(">=", v, other);
    if (name == "le") return CompareOp("<=", v, other);
    if (name == "in") return Contains(other, v);
    if (name == "sameas") {
      if (v.kind() != other.kind()) return false;
      if (v.is_none() || v.is_bool() || v.is_undefined()) return PyEquals(v, other);
      if (v.is_list()) return &v.as_list() == &other.as_list();
      if (v.is_dict() || v.is_namespace()) return v.dict_ptr() == other.dict_ptr();
      return PyEquals(v, other) && (v.is_int() ? v.as_int() >= -5 && v.as_int() <= 256 : false);
    }
    Throw("unsupported test '" + name + "'");
  }

  static constexpr int kMaxEvalDepth = 2000;

  RenderLimits limits_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
};

std::string Located(const std::string& name, const JinjaError& e) {
  if (!e.has_location()) return name + ": " + e.what();
  return name + ":" + std::to_string(e.line()) + ":" + std::to_string(e.column()) + ": " + e.what();
}

}  // namespace

Result<Template> Template::Parse(const std::string& source, const std::string& name) {
  Template t;
  t.name_ = name;
  try {
    t.body_ = std::make_shared<const StmtList>(ParseTemplate(source));
  } catch (const JinjaError& e) {
    return InvalidArgument("jinja parse error: " + Located(name, e));
  } catch (const std::exception& e) {
    return Internal("jinja parse error: " + name + ": " + e.what());
  }
  return t;
}

Result<std::string> Template::Render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  if (!context.is_object() && !context.is_null()) {
    return InvalidArgument("jinja render " + name_ + ": context must be a JSON object");
  }
  if (!body_) return std::string();
  try {
    Interpreter interpreter(limits);
    return interpreter.Run(*body_, context.is_null() ? nlohmann::ordered_json::object() : context);
  } catch (const JinjaError& e) {
    if (e.kind() == JinjaError::Kind::kRaised) {
      return InvalidArgument("template raised: " + std::string(e.what()) + " (" + name_ + ":" +
                             std::to_string(e.line()) + ")");
    }
    std::string message = "jinja render error: " + Located(name_, e);
    return e.kind() == JinjaError::Kind::kLimit ? ResourceExhausted(message) : InvalidArgument(message);
  } catch (const std::exception& e) {
    return Internal("jinja render error: " + name_ + ": " + e.what());
  }
}

}  // namespace anchorage::jinja
