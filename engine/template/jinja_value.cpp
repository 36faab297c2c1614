#include "engine/template/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace anchorage::jinja {

Value Value::Undefined(std::string hint) {
  Value v;
  v.str_ = std::move(hint);
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::move(s);
  return v;
}
Value Value::List(ValueList items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.is_tuple_ = is_tuple;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::Dict(std::shared_ptr<ValueDict> dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::move(dict);
  return v;
}
Value Value::EmptyDict() { return Dict(std::make_shared<ValueDict>()); }
Value Value::Namespace(std::shared_ptr<ValueDict> attrs) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.dict_ = std::move(attrs);
  return v;
}
Value Value::Function(std::shared_ptr<Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::move(fn);
  return v;
}

Value Value::Generator(ValueList items, std::string deferred_error) {
  Value v;
  v.kind_ = Kind::kGenerator;
  v.str_ = std::move(deferred_error);
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Int(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto dict = std::make_shared<ValueDict>();
      for (auto it = j.begin(); it != j.end(); ++it) dict->Set(it.key(), FromJson(it.value()));
      return Dict(std::move(dict));
    }
    default:
      return None();
  }
}

double Value::as_double() const {
  if (kind_ == Kind::kFloat) return float_;
  if (kind_ == Kind::kBool) return bool_ ? 1.0 : 0.0;
  return static_cast<double>(int_);
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !str_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    default:
      return true;
  }
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return is_tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
    case Kind::kGenerator:
      return "generator";
  }
  return "object";
}

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci looks like [-]D[.DDD]e[+-]XX
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    int point = exponent + 1;  // digits before the decimal point
    if (point <= 0) {
      out = "0." + std::string(-point, '0') + digits;
    } else if (point >= static_cast<int>(digits.size())) {
      out = digits + std::string(point - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, point) + "." + digits.substr(point);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  }
  return negative ? "-" + out : out;
}

std::u32string DecodeUtf8(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    int extra;
    if (c < 0x80) {
      cp = c;
      extra = 0;
    } else if ((c >> 5) == 0x6) {
      cp = c & 0x1f;
      extra = 1;
    } else if ((c >> 4) == 0xe) {
      cp = c & 0x0f;
      extra = 2;
    } else if ((c >> 3) == 0x1e) {
      cp = c & 0x07;
      extra = 3;
    } else {
      out.push_back(0xfffd);
      ++i;
      continue;
    }
    if (i + extra >= s.size()) {
      out.push_back(0xfffd);
      break;
    }
    for (int k = 1; k <= extra; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

std::string EncodeUtf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  return out;
}

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

char32_t ToUpperCp(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if (c == 0xb5) return 0x39c;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x178 && c != 0x17f) {
    bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_lower) return (c % 2 == 0) ? c - 1 : c;
    return (c % 2 == 1) ? c - 1 : c;
  }
  if (c == 0x131) return 'I';
  if (c == 0x17f) return 'S';
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 32;
  if (c == 0x3c2) return 0x3a3;
  if (c >= 0x3ac && c <= 0x3af) return c == 0x3ac ? 0x386 : c - 37;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}

char32_t ToLowerCp(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x178 && c != 0x17f) {
    bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_upper) return (c % 2 == 1) ? c + 1 : c;
    return (c % 2 == 0) ? c + 1 : c;
  }
  if (c == 0x130) return 'i';
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c == 0x386) return 0x3ac;
  if (c >= 0x388 && c <= 0x38a) return c + 37;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}

bool IsCased(char32_t c) { return ToUpperCp(c) != c || ToLowerCp(c) != c || c == 0xdf || c == 0x138 || c == 0x149; }

std::string PyUpper(const std::string& s) {
  std::u32string out;
  for (char32_t c : DecodeUtf8(s)) {
    if (c == 0xdf) {
      out += U"SS";
    } else {
      out.push_back(ToUpperCp(c));
    }
  }
  return EncodeUtf8(out);
}

std::string PyLower(const std::string& s) {
  std::u32string out;
  for (char32_t c : DecodeUtf8(s)) out.push_back(ToLowerCp(c));
  return EncodeUtf8(out);
}

namespace {

bool IsPyPrintable(char32_t c) {
  if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f)) return false;
  if ((c >= 0x205f && c <= 0x2064) || c == 0x3000 || c == 0xfeff || (c >= 0xd800 && c <= 0xdfff)) return false;
  return true;
}

std::string StrRepr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::u32string cps = DecodeUtf8(s);
  std::string out(1, quote);
  for (char32_t c : cps) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<char32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!IsPyPrintable(c)) {
      char buf[16];
      if (c < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      } else if (c < 0x10000) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      out += EncodeUtf8(std::u32string(1, c));
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return str_;
    default:
      return Repr();
  }
}

std::string Value::ItemsRepr() const {
  std::string out;
  bool first = true;
  for (const auto& [k, v] : dict_->items) {
    if (!first) out += ", ";
    first = false;
    out += StrRepr(k) + ": " + v.Repr();
  }
  return out;
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return PyFloatRepr(float_);
    case Kind::kString:
      return StrRepr(str_);
    case Kind::kList: {
      std::string out = is_tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].Repr();
      }
      if (is_tuple_ && list_->size() == 1) out += ",";
      out += is_tuple_ ? ")" : "]";
      return out;
    }
    case Kind::kDict:
      return "{" + ItemsRepr() + "}";
    case Kind::kNamespace:
      return "<Namespace {" + ItemsRepr() + "}>";
    case Kind::kCallable:
      return "<function " + fn_->name + ">";
    case Kind::kGenerator:
      return "<generator object>";
  }
  return "";
}

ValueList Value::Iterate() const {
  switch (kind_) {
    case Kind::kUndefined:
      return {};
    case Kind::kGenerator:
      if (!str_.empty()) throw JinjaError(str_);
      return *list_;
    case Kind::kList:
      return *list_;
    case Kind::kDict: {
      ValueList keys;
      for (const auto& kv : dict_->items) keys.push_back(String(kv.first));
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (char32_t c : DecodeUtf8(str_)) chars.push_back(String(EncodeUtf8(std::u32string(1, c))));
      return chars;
    }
    default:
      throw JinjaError("'" + TypeName() + "' object is not iterable");
  }
}

int64_t Value::Length() const {
  switch (kind_) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(DecodeUtf8(str_).size());
    case Kind::kList:
      return static_cast<int64_t>(list_->size());
    case Kind::kDict:
      return static_cast<int64_t>(dict_->items.size());
    default:
      throw JinjaError("object of type '" + TypeName() + "' has no len()");
  }
}

const Value* ValueDict::Find(const std::string& key) const {
  for (const auto& kv : items) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

void ValueDict::Set(const std::string& key, Value value) {
  for (auto& kv : items) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value CallArgs::Get(size_t index, const std::string& name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& kv : keyword) {
    if (kv.first == name) return kv.second;
  }
  return fallback;
}

bool CallArgs::Has(size_t index, const std::string& name) const {
  if (index < positional.size()) return true;
  for (const auto& kv : keyword) {
    if (kv.first == name) return true;
  }
  return false;
}

bool PyEquals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!PyEquals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const auto& x = a.as_dict().items;
      if (x.size() != b.as_dict().items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = b.as_dict().Find(k);
        if (!other || !PyEquals(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return a.dict_ptr() == b.dict_ptr();
    case Value::Kind::kCallable:
      return &a.as_callable() == &b.as_callable();
    case Value::Kind::kGenerator:
      return &a.as_list() == &b.as_list();
    default:
      return false;
  }
}

int PyCompare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!PyEquals(x[i], y[i])) return PyCompare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw JinjaError("'<' not supported between instances of '" + a.TypeName() + "' and '" + b.TypeName() + "'");
}

namespace {

void JsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  if (!ensure_ascii) {
    for (unsigned char c : s) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
          } else {
            out += static_cast<char>(c);
          }
      }
    }
  } else {
    for (char32_t c : DecodeUtf8(s)) {
      if (c < 0x80 && c != '"' && c != '\\' && c >= 0x20) {
        out += static_cast<char>(c);
      } else if (c == '"') {
        out += "\\\"";
      } else if (c == '\\') {
        out += "\\\\";
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\b') {
        out += "\\b";
      } else if (c == '\f') {
        out += "\\f";
      } else {
        char buf[16];
        if (c >= 0x10000) {
          char32_t v = c - 0x10000;
          std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                        static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
        } else {
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
        }
        out += buf;
      }
    }
  }
  out += '"';
}

void JsonValue(const Value& v, int indent, int level, const std::string& item_sep, const std::string& key_sep,
               bool ensure_ascii, bool sort_keys, std::string& out) {
  if (level > 512) throw JinjaError("tojson: nesting too deep");
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(lvl), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += PyFloatRepr(d);
      }
      return;
    }
    case Value::Kind::kString:
      JsonString(v.as_string(), ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      const auto& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        JsonValue(items[i], indent, level + 1, item_sep, key_sep, ensure_ascii, sort_keys, out);
      }
      newline(level);
      out += "]";
      return;
    }
    case Value::Kind::kDict: {
      auto items = v.as_dict().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        JsonString(items[i].first, ensure_ascii, out);
        out += key_sep;
        JsonValue(items[i].second, indent, level + 1, item_sep, key_sep, ensure_ascii, sort_keys, out);
      }
      newline(level);
      out += "}";
      return;
    }
    default:
      throw JinjaError("Object of type " + v.TypeName() + " is not JSON serializable");
  }
}

}  // namespace

std::string ToJson(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                   bool ensure_ascii, bool sort_keys) {
  std::string out;
  JsonValue(v, indent, 0, item_sep, key_sep, ensure_ascii, sort_keys, out);
  return out;
}

}  // namespace anchorage::jinja
