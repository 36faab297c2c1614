// Units of the endpoint: the output parser (reasoning, content, tool calls, split anywhere), request
// validation, the ranked engine lock and the metrics text.
#include <QTemporaryDir>
#include <QtTest>

#include <thread>

#include "engine/server/draft_policy.h"
#include "engine/server/engine_lock.h"
#include "engine/server/metrics.h"
#include "engine/server/openai_api.h"
#include "engine/server/output_parser.h"
#include "engine/server/service.h"

using namespace anchorage;
using ojson = nlohmann::ordered_json;

namespace {

const char* kToolOutput =
    "I should look it up.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=detail>\n{\"wind\": true}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
    "<function=get_time>\n<parameter=zone>\n42\n</parameter>\n</function>\n</tool_call>";

ojson Tools() {
  return ojson::parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"detail\":{\"type\":\"object\"}}}}},\n                          {\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":{\"zone\":{\"type\":\"string\"}}}}}]");
}

}  // namespace

class TestServerUnits : public QObject {
  Q_OBJECT

 private slots:
  void backendSpecsParseOrSayWhatIsWrong() {
    auto spec = ParseBackendSpec("big=http://10.0.0.5:8000/v1,key=VLLM_KEY");
    QVERIFY(spec.ok());
    QCOMPARE(spec->name, std::string("big"));
    QCOMPARE(spec->url, std::string("http://10.0.0.5:8000/v1"));
    QCOMPARE(spec->key_env, std::string("VLLM_KEY"));
    QVERIFY(ParseBackendSpec("Qwen/Qwen3.5-27B=http://h:1").ok());
    for (const char* bad : {"big", "=http://h:1", "big=h:1", "big=https://h:1", "big=http://", "big=http://h:1,token=X", "big=http://h:1,key=",
                            "a b=http://h:1"}) {
      auto r = ParseBackendSpec(bad);
      QVERIFY2(!r.ok() && r.status().code() == StatusCode::kInvalidArgument, bad);
    }
    char arg0[] = "anchorage-server", flag[] = "--backend", one[] = "a=http://h:1", two[] = "a=http://h:2";
    char* argv[] = {arg0, flag, one, flag, two};
    auto twice = ParseServerCommandLine(5, argv);
    QVERIFY(!twice.ok() && twice.status().message().find("two backends") != std::string::npos);
    QTemporaryDir dir;
    const QString file = dir.filePath("config.json");
    QFile f(file);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(ojson{{"backend", {"a=http://h:1", "b=http://h:2,key=B_KEY"}}, {"backend-timeout-s", 5}}.dump().c_str());
    f.close();
    QByteArray path = file.toUtf8();
    char config[] = "--config";
    char* argv2[] = {arg0, config, path.data()};
    auto from_file = ParseServerCommandLine(3, argv2);
    QVERIFY2(from_file.ok(), from_file.ok() ? "" : from_file.status().message().c_str());
    QCOMPARE(from_file->backends.size(), size_t(2));
    QCOMPARE(from_file->backends[1].key_env, std::string("B_KEY"));
    QCOMPARE(from_file->backend_timeout_ms, int64_t(5000));
  }

  // The break-even acceptance of a window beside others: R b / (a + b R) of the fitted step cost a + b R,
  // never below 0 or above 1; no fit (1: never) until the steps have seen two row counts.
  void rowCostsGiveTheBreakEvenAcceptance() {
    RowCostModel costs;
    for (int i = 0; i < 10; ++i) costs.Record(2, 20.0 + 5.0 * 2);
    QCOMPARE(costs.BreakEven(2), 1.0);  // one row count: no line through it
    for (int i = 0; i < 10; ++i) costs.Record(i % 2 == 0 ? 1 : 9, 20.0 + 5.0 * (i % 2 == 0 ? 1 : 9));
    double fixed = 0, per_row = 0;
    QVERIFY(costs.Fit(&fixed, &per_row));
    QVERIFY(std::fabs(fixed - 20.0) < 1e-6 && std::fabs(per_row - 5.0) < 1e-6);
    QVERIFY(std::fabs(costs.BreakEven(2) - 10.0 / 30.0) < 1e-9);
    QVERIFY(std::fabs(costs.BreakEven(4) - 20.0 / 40.0) < 1e-9);
    RowCostModel weights_bound;  // rows nearly free: any acceptance pays
    for (int i = 0; i < 20; ++i) weights_bound.Record(1 + i % 8, 30.0 + 0.01 * (1 + i % 8));
    QVERIFY(weights_bound.BreakEven(4) < 0.01);
    RowCostModel noisy;  // a step of more rows measured faster: the slope is not negative
    for (int i = 0; i < 20; ++i) noisy.Record(1 + i % 3, 30.0 - (i % 3));
    QCOMPARE(noisy.BreakEven(2), 0.0);
  }

  void parserSplitsReasoningContentAndCalls() {
    OutputParser p(true, Tools());
    p.Push(kToolOutput);
    p.Finish();
    QCOMPARE(p.reasoning(), std::string("I should look it up."));
    QCOMPARE(p.content(), std::string("Let me check.\n\n"));
    QCOMPARE(p.tool_calls().size(), size_t(2));
    QCOMPARE(p.tool_calls()[0].name, std::string("get_weather"));
    QCOMPARE(p.tool_calls()[0].arguments.dump(), std::string("{\"city\":\"New York\",\"days\":3,\"detail\":{\"wind\":true}}"));
    QCOMPARE(p.tool_calls()[1].arguments.dump(), std::string("{\"zone\":\"42\"}"));  // typed string by its schema
  }

  void parserGivesTheSameResultForEverySplit() {
    OutputParser whole(true, Tools());
    whole.Push(kToolOutput);
    whole.Finish();
    const std::string text = kToolOutput;
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      for (size_t step : {size_t(1), size_t(3), size_t(7)}) {
        OutputParser p(true, Tools());
        std::string reasoning, content;
        size_t calls = 0;
        auto take = [&](const OutputDelta& d) { reasoning += d.reasoning; content += d.content; calls += d.tool_calls.size(); };
        take(p.Push(text.substr(0, cut)));
        for (size_t i = cut; i < text.size(); i += step) take(p.Push(text.substr(i, step)));
        take(p.Finish());
        QCOMPARE(reasoning, whole.reasoning());
        QCOMPARE(content, whole.content());
        QCOMPARE(calls, size_t(2));
      }
    }
  }

  void parserWithoutThinkingAndUnclosedCall() {
    OutputParser p(false, ojson::array());
    p.Push("<think>\nhmm\n</think>\n\nAnswer <tool_call>\n<function=f>");
    p.Finish();
    QCOMPARE(p.reasoning(), std::string("hmm"));
    QCOMPARE(p.content(), std::string("Answer <tool_call>\n<function=f>"));
    QVERIFY(p.tool_calls().empty());

    OutputParser plain(false, ojson::array());
    plain.Push("Just text, <b>no tags</b>.");
    plain.Finish();
    QCOMPARE(plain.content(), std::string("Just text, <b>no tags</b>."));
    QVERIFY(plain.reasoning().empty());
  }

  // The settings schema's defaults and the engine's ResidentOptions defaults are the same values:
  // a default document read back gives the engine's defaults (memory limits depend on the machine).
  void settingsDefaultsAreTheEngineDefaults() {
    QTemporaryDir dir;
    auto store = SettingsStore::Open((dir.path() + "/settings.json").toStdString());
    QVERIFY(store.ok());
    const ResidentOptions read = ResidentOptionsFromSettings(store->Effective());
    const ResidentOptions engine;
    QCOMPARE(read.enabled, engine.enabled);
    QCOMPARE(read.end_anchor, engine.end_anchor);
    QCOMPARE(read.end_align_reasoning, engine.end_align_reasoning);
    QCOMPARE(read.anchor_budget_bytes, engine.anchor_budget_bytes);
    QCOMPARE(read.guest_max_tokens, engine.guest_max_tokens);
    QCOMPARE(read.stash_budget_bytes, engine.stash_budget_bytes);
    QCOMPARE(read.pin_budget_bytes, engine.pin_budget_bytes);
    QCOMPARE(read.park_budget_bytes, engine.park_budget_bytes);
    QCOMPARE(read.store_enabled, engine.store_enabled);
    QCOMPARE(read.store_budget_bytes, engine.store_budget_bytes);
    QCOMPARE(read.store_entry_cap_bytes, engine.store_entry_cap_bytes);
    QCOMPARE(read.store_prefix_snapshots, engine.store_prefix_snapshots);
    QVERIFY(read.memory_peak_bytes > read.memory_ceiling_bytes);
  }

  void toolCallTextStaysContentWithoutTools() {
    OutputParser p(false, ojson::array(), false);
    const std::string text = "Call: <tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call> done";
    for (char c : text) p.Push(std::string(1, c));
    p.Finish();
    QVERIFY(p.tool_calls().empty());
    QCOMPARE(p.content(), text);
  }

  void requestValidation() {
    ApiError e;
    ParseOptions o{"m", 100, {}, false};
    auto r = ParseCompletionRequest(RequestKind::kChat,
                                    "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                                    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}}]}],"
                                    "\"temperature\":0.5,\"top_k\":-1,\"stop\":[\"a\",\"b\"],\"max_completion_tokens\":9,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                                    "\"chat_template_kwargs\":{\"enable_thinking\":false},\"conversation_id\":\"s1\"}",
                                    o, &e);
    QVERIFY2(r.has_value(), e.message.c_str());
    const ojson& m = r->template_body["messages"];
    QCOMPARE(m[0]["role"].get<std::string>(), std::string("system"));
    QCOMPARE(m[0]["content"].get<std::string>(), std::string("ab"));
    QCOMPARE(m[1]["tool_calls"][0]["function"]["arguments"]["x"].get<int>(), 1);  // parsed for the template
    QCOMPARE(r->sampling.temperature, 0.5f);
    QCOMPARE(r->sampling.top_k, 0);
    QCOMPARE(r->sampling.max_tokens, int64_t(9));
    QCOMPARE(r->sampling.stop_strings.size(), size_t(2));
    QVERIFY(r->stream && r->include_usage);
    QCOMPARE(r->session, std::string("s1"));
    QCOMPARE(r->template_body["chat_template_kwargs"]["enable_thinking"].get<bool>(), false);

    QVERIFY(!ParseCompletionRequest(RequestKind::kChat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", o, &e));
    QCOMPARE(e.param, std::string("top_logprobs"));
    QVERIFY(!ParseCompletionRequest(RequestKind::kChat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", o, &e));
    QCOMPARE(e.param, std::string("n"));
    QVERIFY(!ParseCompletionRequest(RequestKind::kChat, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", o, &e));
    QCOMPARE(e.param, std::string("messages[0].content[0].type"));
    QVERIFY(!ParseCompletionRequest(RequestKind::kCompletion, "{\"prompt\":[1,2,100]}", o, &e));
    QCOMPARE(e.param, std::string("prompt"));
    auto ids = ParseCompletionRequest(RequestKind::kCompletion, "{\"prompt\":[1,2,99],\"logprobs\":2}", o, &e);
    QVERIFY(ids.has_value());
    QCOMPARE(ids->prompt_ids, (std::vector<int32_t>{1, 2, 99}));
    QCOMPARE(ids->top_logprobs, 2);
  }

  // OpenAI's "user" names an end user; sessions come from conversation ids only.
  void userIsNotASession() {
    ApiError e;
    ParseOptions o{"m", 100, {}, false};
    auto r = ParseCompletionRequest(RequestKind::kChat, R"({"user": "alice", "messages": [{"role": "user", "content": "x"}]})", o, &e);
    QVERIFY(r.has_value());
    QVERIFY(r->session.empty());
    r = ParseCompletionRequest(RequestKind::kChat, R"({"user": "alice", "conversation_id": "c7", "messages": [{"role": "user", "content": "x"}]})", o, &e);
    QVERIFY(r.has_value());
    QCOMPARE(r->session, std::string("c7"));
    // Any model name is served by the one model unless names are strict; aliases always are.
    ParseOptions strict{"m", 100, {"alias"}, true};
    QVERIFY(ParseCompletionRequest(RequestKind::kChat, R"({"model": "alias", "messages": [{"role": "user", "content": "x"}]})", strict, &e).has_value());
    QVERIFY(!ParseCompletionRequest(RequestKind::kChat, R"({"model": "other", "messages": [{"role": "user", "content": "x"}]})", strict, &e).has_value());
    QCOMPARE(e.status, 404);
    auto lenient = ParseCompletionRequest(RequestKind::kChat, R"({"model": "other", "messages": [{"role": "user", "content": "x"}]})", o, &e);
    QVERIFY(lenient.has_value());
    QCOMPARE(lenient->model, std::string("m"));
  }

  void invalidUtf8BodyNamesItsOffset() {
    ApiError e;
    ParseOptions o{"m", 100, {}, false};
    const std::string head = "{\"messages\": [{\"role\": \"user\", \"content\": \"ab";
    for (const char* bad : {"\xc3", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80"}) {  // cut, surrogate, overlong, > U+10FFFF
      QVERIFY(!ParseCompletionRequest(RequestKind::kChat, head + bad + "\"}]}", o, &e));
      QCOMPARE(e.code, std::string("invalid_utf8"));
      QVERIFY2(e.message.find("offset " + std::to_string(head.size())) != std::string::npos, e.message.c_str());
    }
    QVERIFY(ParseCompletionRequest(RequestKind::kChat, head + "中文 🙂\"}]}", o, &e).has_value());
  }

  void requestRankBeatsIdleWork() {
    EngineLock lock;
    QVERIFY(lock.TryLockForIdle());
    QVERIFY(!lock.ShouldYield());
    std::atomic<bool> got{false};
    std::thread request([&] { lock.LockForRequest(); got = true; lock.UnlockRequest(); });
    while (!lock.ShouldYield()) std::this_thread::yield();
    QVERIFY(!got);
    lock.UnlockIdle();
    request.join();
    QVERIFY(got);
    // From the moment a request waits until it has run, idle work cannot take the lock.
    lock.LockForRequest();
    std::atomic<bool> release{false};
    std::thread second([&] {
      lock.LockForRequest();
      while (!release) std::this_thread::yield();
      lock.UnlockRequest();
    });
    while (lock.waiting_requests() == 0) std::this_thread::yield();
    lock.UnlockRequest();
    for (int i = 0; i < 1000; ++i) QVERIFY(!lock.TryLockForIdle());
    release = true;
    second.join();
    QVERIFY(lock.TryLockForIdle());
    lock.UnlockIdle();
  }

  void metricsText() {
    Metrics m;
    m.CountRequest("/v1/chat/completions", 200);
    m.CountRequest("/v1/chat/completions", 200);
    m.ObserveTtftMs(30);
    m.ObserveTtftMs(3000);
    m.CountTokens(10, 4, 7);
    const std::string text = m.Render(3, true);
    QVERIFY(text.find("anchorage_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n") != std::string::npos);
    QVERIFY(text.find("anchorage_ttft_ms_bucket{le=\"50\"} 1\n") != std::string::npos);
    QVERIFY(text.find("anchorage_ttft_ms_bucket{le=\"+Inf\"} 2\n") != std::string::npos);
    QVERIFY(text.find("anchorage_cached_tokens_total 4\n") != std::string::npos);
    QVERIFY(text.find("anchorage_queue_depth 3\n") != std::string::npos);
    QVERIFY(text.find("anchorage_engine_busy 1\n") != std::string::npos);
  }
};

QTEST_APPLESS_MAIN(TestServerUnits)
#include "test_server_units.moc"
