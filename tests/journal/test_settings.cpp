// The settings document: validation naming every bad field, versions, persistence, fallback, overrides.
#include <QtTest>

#include <string>
#include <vector>

#include "engine/core/file_util.h"
#include "engine/settings/settings.h"

using namespace anchorage;

namespace {

constexpr int64_t k64GiB = int64_t{64} << 30;

SettingsStore OpenOrFail(const std::string& path) {
  SettingsOptions o;
  o.total_ram_bytes = k64GiB;
  Result<SettingsStore> s = SettingsStore::Open(path, o);
  if (!s.ok()) qFatal("SettingsStore::Open: %s", s.status().ToString().c_str());
  return std::move(s).value();
}

std::string FileBytes(const std::string& path) {
  Result<std::string> r = ReadFile(path);
  return r.ok() ? *r : std::string("<missing>");
}

std::vector<std::string> FieldNames(const ReplaceOutcome& o) {
  std::vector<std::string> names;
  if (o.error) {
    for (const FieldError& e : o.error->fields) names.push_back(e.field);
  }
  return names;
}

std::string MessageFor(const ReplaceOutcome& o, const std::string& field) {
  for (const FieldError& e : o.error->fields) {
    if (e.field == field) return e.message;
  }
  return "<none>";
}

}  // namespace

class TestSettings : public QObject {
  Q_OBJECT

  QTemporaryDir dir_;
  int case_ = 0;
  std::string NewPath() { return dir_.path().toStdString() + "/case" + std::to_string(case_++) + "/settings.json"; }

 private slots:
  void defaultsComeFromTheSchemaAndTheMachine() {
    SettingsStore s = OpenOrFail(NewPath());
    QVERIFY(s.startup_warning().ok());
    nlohmann::json doc = s.Document();
    QCOMPARE(doc["version"].get<int64_t>(), int64_t{1});
    QCOMPARE(doc["memory"]["ceiling_gb"].get<double>(), 32.0);
    QCOMPARE(doc["memory"]["prefill_peak_gb"].get<double>(), 44.8);
    QCOMPARE(doc["memory"]["allocator_slack_gb"].get<double>(), 0.5);
    QCOMPARE(doc["resident"]["resident_gb"].get<double>(), 2.5);
    QCOMPARE(doc["resident"]["guest_max_tokens"].get<int64_t>(), int64_t{8192});
    QCOMPARE(doc["disk_cache"]["mode"].get<std::string>(), std::string("readwrite"));
    QCOMPARE(doc["spill"]["min_tokens"].get<int64_t>(), int64_t{16384});
    QCOMPARE(doc["shadow"]["model"].get<std::string>(), std::string(""));
    QCOMPARE(doc["journal"]["retention_rows"].get<int64_t>(), int64_t{1000000});
    QVERIFY(!doc.contains("overrides"));
    std::vector<std::string> areas;
    for (const auto& [k, v] : doc.items()) areas.push_back(k);
    QCOMPARE(areas.size(), size_t{13});  // version and twelve areas
    QCOMPARE(doc["engine"]["kv_dtype"].get<std::string>(), std::string("auto"));
    QCOMPARE(doc["backends"]["upstreams"].get<std::string>(), std::string());  // none unless asked for
    QCOMPARE(doc["compaction"]["mode"].get<std::string>(), std::string("continuation"));
    QCOMPARE(doc["response_cache"]["enabled"].get<bool>(), false);  // off unless asked for

    nlohmann::json schema = s.Schema();
    size_t fields = 0;
    for (const auto& [area, obj] : schema["areas"].items()) {
      for (const auto& [name, f] : obj.items()) {
        ++fields;
        QVERIFY2(!f["description"].get<std::string>().empty(), name.c_str());
        QCOMPARE(f["default"], doc[area][name]);
      }
    }
    QCOMPARE(fields, SettingsSchemaFields(k64GiB).size());
    QCOMPARE(schema["areas"]["disk_cache"]["mode"]["values"], (nlohmann::json{"off", "read", "readwrite"}));
    QCOMPARE(schema["areas"]["shadow"]["ration"]["max"].get<double>(), 0.5);
    QVERIFY(MachineTotalRamBytes() > 0);
    // A valid document that nobody wrote yet is not on disk.
    QVERIFY(!FileExists(s.path()));
  }

  void validChangeBumpsVersionPersistsAndSurvivesReopen() {
    std::string path = NewPath();
    {
      SettingsStore s = OpenOrFail(path);
      nlohmann::json doc = s.Document();
      doc["memory"]["ceiling_gb"] = 20;
      doc["disk_cache"]["mode"] = "readwrite";
      ReplaceOutcome o = s.Replace(doc);
      QVERIFY2(o.ok(), o.error->message.c_str());
      QCOMPARE(o.version, int64_t{2});
      QCOMPARE(s.version(), int64_t{2});
      QCOMPARE(s.Document()["memory"]["ceiling_gb"].get<double>(), 20.0);
      nlohmann::json on_disk = nlohmann::json::parse(FileBytes(path));
      QCOMPARE(on_disk["version"].get<int64_t>(), int64_t{2});
      QCOMPARE(on_disk["disk_cache"]["mode"].get<std::string>(), std::string("readwrite"));
      nlohmann::json bak = nlohmann::json::parse(FileBytes(path + ".bak"));
      QCOMPARE(bak["version"].get<int64_t>(), int64_t{1});
      QCOMPARE(bak["memory"]["ceiling_gb"].get<double>(), 32.0);
    }
    SettingsStore again = OpenOrFail(path);
    QVERIFY(again.startup_warning().ok());
    QCOMPARE(again.version(), int64_t{2});
    QCOMPARE(again.Document()["memory"]["ceiling_gb"].get<double>(), 20.0);
    QCOMPARE(again.Document()["disk_cache"]["mode"].get<std::string>(), std::string("readwrite"));
  }

  void staleVersionChangesNothing() {
    std::string path = NewPath();
    SettingsStore s = OpenOrFail(path);
    int calls = 0;
    s.AddListener([&](const nlohmann::json&, int64_t) { ++calls; });
    nlohmann::json v1 = s.Document();
    nlohmann::json edit = v1;
    edit["resident"]["pin_gb"] = 3;
    QVERIFY(s.Replace(edit).ok());
    std::string bytes = FileBytes(path);
    std::string bak_bytes = FileBytes(path + ".bak");
    nlohmann::json before = s.Document();

    v1["resident"]["pin_gb"] = 7;  // edits version 1, which is gone
    ReplaceOutcome o = s.Replace(v1);
    QVERIFY(!o.ok());
    QVERIFY(o.error->kind == SettingsError::Kind::kStaleVersion);
    QCOMPARE(o.error->http_status(), 409);
    QCOMPARE(o.error->current_version, int64_t{2});
    QCOMPARE(o.version, int64_t{2});
    QCOMPARE(o.error->ToJson()["error"]["code"].get<std::string>(), std::string("stale_version"));
    QCOMPARE(FileBytes(path), bytes);
    QCOMPARE(FileBytes(path + ".bak"), bak_bytes);
    QCOMPARE(s.Document(), before);
    QCOMPARE(calls, 1);
  }

  void eachInvalidFieldIsNamed_data() {
    QTest::addColumn<QString>("field");
    QTest::addColumn<QString>("json");  // the value; "<remove>" deletes the field
    QTest::addColumn<QString>("expect");
    QTest::newRow("wrong type") << "memory.ceiling_gb" << "\"big\"" << "expected a number, got string";
    QTest::newRow("integer wanted") << "resident.guest_max_tokens" << "8.5" << "expected an integer, got number";
    QTest::newRow("boolean wanted") << "resident.enabled" << "1" << "expected a boolean, got integer";
    QTest::newRow("above range") << "disk_cache.ttl_days" << "99999" << "99999 is outside 0..3650";
    QTest::newRow("below range") << "shadow.ration" << "-0.5" << "-0.5 is outside 0..0.5";
    QTest::newRow("bad enum") << "disk_cache.mode" << "\"sometimes\"" << "\"sometimes\" is not one of off, read, readwrite";
    QTest::newRow("unknown field") << "memory.bogus_gb" << "1" << "unknown field";
    QTest::newRow("missing field") << "resident.park_gb" << "<remove>" << "missing";
    QTest::newRow("relation") << "memory.prefill_peak_gb" << "10" << "10 is below memory.ceiling_gb 32";
    QTest::newRow("backend without URL") << "backends.upstreams" << "\"big=http://h:1 small\"" << "backend 'small': expected NAME=URL[,key=ENVVAR]";
    QTest::newRow("backend named twice") << "backends.upstreams" << "\"a=http://h:1 a=http://h:2\"" << "two backends are named 'a'";
    QTest::newRow("long string") << "shadow.question" << ("\"" + QString(300, 'q') + "\"") << "longer than 256 bytes";
  }
  void eachInvalidFieldIsNamed() {
    QFETCH(QString, field);
    QFETCH(QString, json);
    QFETCH(QString, expect);
    std::string path = NewPath();
    SettingsStore s = OpenOrFail(path);
    QVERIFY(s.Replace(s.Document()).ok());  // a file on disk to compare
    std::string bytes = FileBytes(path);
    nlohmann::json doc = s.Document();
    std::string key = field.toStdString();
    std::string area = key.substr(0, key.find('.'));
    std::string name = key.substr(key.find('.') + 1);
    if (json == "<remove>") {
      doc[area].erase(name);
    } else {
      doc[area][name] = nlohmann::json::parse(json.toStdString());
    }
    ReplaceOutcome o = s.Replace(doc);
    QVERIFY(!o.ok());
    QVERIFY(o.error->kind == SettingsError::Kind::kInvalid);
    QCOMPARE(o.error->http_status(), 400);
    QCOMPARE(FieldNames(o), std::vector<std::string>{key});
    QCOMPARE(QString::fromStdString(MessageFor(o, key)), expect);
    QCOMPARE(o.error->ToJson()["error"]["param"].get<std::string>(), key);
    QCOMPARE(s.version(), int64_t{2});
    QCOMPARE(FileBytes(path), bytes);
  }

  void severalInvalidFieldsAreAllNamed() {
    std::string path = NewPath();
    SettingsStore s = OpenOrFail(path);
    int calls = 0;
    s.AddListener([&](const nlohmann::json&, int64_t) { ++calls; });
    nlohmann::json doc = s.Document();
    doc["memory"]["ceiling_gb"] = "lots";
    doc["resident"].erase("stash_gb");
    doc["disk_cache"]["mode"] = "always";
    doc["disk_cache"]["admit_after"] = 0;
    doc["journal"]["retention_days"] = true;
    doc["shadow"]["colour"] = "blue";
    doc["tuning"] = nlohmann::json::object();
    doc.erase("state_store");
    ReplaceOutcome o = s.Replace(doc);
    QVERIFY(!o.ok());
    QCOMPARE(FieldNames(o), (std::vector<std::string>{"state_store", "memory.ceiling_gb", "resident.stash_gb",
                                                      "disk_cache.mode", "disk_cache.admit_after",
                                                      "journal.retention_days", "shadow.colour", "tuning"}));
    nlohmann::json body = o.error->ToJson();
    QCOMPARE(body["error"]["fields"].size(), size_t{8});
    QCOMPARE(body["error"]["fields"][3]["field"].get<std::string>(), std::string("disk_cache.mode"));
    QVERIFY(o.error->message.find("8 invalid settings fields") == 0);
    QCOMPARE(s.version(), int64_t{1});
    QVERIFY(!FileExists(path));
    QCOMPARE(calls, 0);

    nlohmann::json no_version = s.Document();
    no_version.erase("version");
    ReplaceOutcome nv = s.Replace(no_version);
    QCOMPARE(FieldNames(nv), std::vector<std::string>{"version"});
    ReplaceOutcome not_object = s.Replace(nlohmann::json::array());
    QCOMPARE(FieldNames(not_object), std::vector<std::string>{""});
  }

  void truncatedFileFallsBackToTheLastGoodVersion() {
    std::string path = NewPath();
    {
      SettingsStore s = OpenOrFail(path);
      nlohmann::json doc = s.Document();
      doc["state_store"]["budget_gb"] = 3;
      QVERIFY(s.Replace(doc).ok());  // version 2
      doc = s.Document();
      doc["state_store"]["budget_gb"] = 5;
      QVERIFY(s.Replace(doc).ok());  // version 3; .bak holds version 2
    }
    std::string bytes = FileBytes(path);
    QVERIFY(WriteFileAtomic(path, bytes.substr(0, bytes.size() / 2)).ok());
    {
      SettingsStore s = OpenOrFail(path);
      Status w = s.startup_warning();
      QVERIFY(!w.ok());
      QCOMPARE(w.code(), StatusCode::kCorrupt);
      QVERIFY2(w.message().find(path + ": not valid JSON") != std::string::npos, w.message().c_str());
      QVERIFY2(w.message().find("last good version 2 from " + path + ".bak") != std::string::npos,
               w.message().c_str());
      QCOMPARE(s.version(), int64_t{2});
      QCOMPARE(s.Document()["state_store"]["budget_gb"].get<double>(), 3.0);
      // The next change edits the version in force and replaces the broken file.
      nlohmann::json doc = s.Document();
      doc["state_store"]["budget_gb"] = 4;
      ReplaceOutcome o = s.Replace(doc);
      QVERIFY(o.ok());
      QCOMPARE(o.version, int64_t{3});
    }
    SettingsStore fixed = OpenOrFail(path);
    QVERIFY(fixed.startup_warning().ok());
    QCOMPARE(fixed.Document()["state_store"]["budget_gb"].get<double>(), 4.0);

    // Both files bad: defaults, and the warning names both.
    QVERIFY(WriteFileAtomic(path, "{\"version\": 3, \"mem").ok());
    QVERIFY(WriteFileAtomic(path + ".bak", "[]").ok());
    SettingsStore defaults = OpenOrFail(path);
    Status w = defaults.startup_warning();
    QVERIFY(!w.ok());
    QVERIFY2(w.message().find(path + ".bak: not a JSON object") != std::string::npos, w.message().c_str());
    QVERIFY2(w.message().find("using defaults") != std::string::npos, w.message().c_str());
    QCOMPARE(defaults.Document(), DefaultSettingsDocument(k64GiB));
  }

  void fileFieldsOutOfRangeAreReportedAndDefaulted() {
    std::string path = NewPath();
    nlohmann::json doc = DefaultSettingsDocument(k64GiB);
    doc["version"] = 5;
    doc["disk_cache"]["ttl_days"] = -3;
    doc["resident"].erase("pin_gb");  // a field this file predates: default, no warning
    QVERIFY(MakeDirectories(path.substr(0, path.rfind('/'))).ok());
    QVERIFY(WriteFileAtomic(path, doc.dump()).ok());
    SettingsStore s = OpenOrFail(path);
    QCOMPARE(s.version(), int64_t{5});
    QCOMPARE(s.Document()["disk_cache"]["ttl_days"].get<int64_t>(), int64_t{7});
    QCOMPARE(s.Document()["resident"]["pin_gb"].get<double>(), 4.0);
    Status w = s.startup_warning();
    QVERIFY(!w.ok());
    QVERIFY2(w.message().find("disk_cache.ttl_days: -3 is outside 0..3650, default used") != std::string::npos,
             w.message().c_str());
  }

  void overridesWinAndAreListed() {
    std::string path = NewPath();
    SettingsStore s = OpenOrFail(path);
    QVERIFY(s.ApplyOverride("memory.ceiling_gb", 12, "--mem-ceiling-gb").ok());
    QVERIFY(s.ApplyOverride("disk_cache.mode", "read", "--disk-cache").ok());
    Status unknown = s.ApplyOverride("memory.ceiling", 12, "--x");
    QCOMPARE(unknown.code(), StatusCode::kInvalidArgument);
    QVERIFY(unknown.message().find("memory.ceiling from --x: unknown field") != std::string::npos);
    Status bad = s.ApplyOverride("disk_cache.mode", "sometimes", "--disk-cache");
    QCOMPARE(bad.code(), StatusCode::kInvalidArgument);

    QCOMPARE(s.Effective()["memory"]["ceiling_gb"].get<double>(), 12.0);
    QCOMPARE(s.Effective()["disk_cache"]["mode"].get<std::string>(), std::string("read"));
    nlohmann::json doc = s.Document();
    QCOMPARE(doc["memory"]["ceiling_gb"].get<double>(), 32.0);  // the stored value
    nlohmann::json expected = {
        {"disk_cache.mode", {{"value", "read"}, {"source", "--disk-cache"}, {"stored", "readwrite"}}},
        {"memory.ceiling_gb", {{"value", 12.0}, {"source", "--mem-ceiling-gb"}, {"stored", 32.0}}}};
    QCOMPARE(doc["overrides"], expected);
    QCOMPARE(s.Overrides(), expected);

    // A GET body sent back as is (overrides included) is a valid PUT; the override still wins.
    nlohmann::json effective_seen;
    s.AddListener([&](const nlohmann::json& e, int64_t) { effective_seen = e; });
    doc["memory"]["ceiling_gb"] = 30;
    ReplaceOutcome o = s.Replace(doc);
    QVERIFY2(o.ok(), o.error->message.c_str());
    QCOMPARE(s.Document()["memory"]["ceiling_gb"].get<double>(), 30.0);
    QCOMPARE(s.Effective()["memory"]["ceiling_gb"].get<double>(), 12.0);
    QCOMPARE(effective_seen["memory"]["ceiling_gb"].get<double>(), 12.0);
    QCOMPARE(s.Overrides()["memory.ceiling_gb"]["stored"].get<double>(), 30.0);
    QVERIFY(!nlohmann::json::parse(FileBytes(path)).contains("overrides"));
  }

  void listenerFiresOncePerCommittedChange() {
    SettingsStore s = OpenOrFail(NewPath());
    std::vector<int64_t> versions;
    std::vector<int64_t> retention;
    int id = s.AddListener([&](const nlohmann::json& e, int64_t v) {
      versions.push_back(v);
      retention.push_back(e["journal"]["retention_days"].get<int64_t>());
      QCOMPARE(e["version"].get<int64_t>(), v);
    });
    nlohmann::json doc = s.Document();
    doc["journal"]["retention_days"] = 10;
    QVERIFY(s.Replace(doc).ok());
    QVERIFY(!s.Replace(doc).ok());  // stale now
    doc = s.Document();
    doc["journal"]["retention_days"] = 11;
    QVERIFY(s.Replace(doc).ok());
    doc = s.Document();
    doc["journal"]["retention_days"] = 0;  // out of range
    QVERIFY(!s.Replace(doc).ok());
    QCOMPARE(versions, (std::vector<int64_t>{2, 3}));
    QCOMPARE(retention, (std::vector<int64_t>{10, 11}));
    s.RemoveListener(id);
    doc = s.Document();
    doc["journal"]["retention_days"] = 12;
    QVERIFY(s.Replace(doc).ok());
    QCOMPARE(versions.size(), size_t{2});
  }

  void failedWriteChangesNothing() {
    std::string path = NewPath();
    SettingsStore s = OpenOrFail(path);
    int calls = 0;
    s.AddListener([&](const nlohmann::json&, int64_t) { ++calls; });
    // A non-empty directory where the backup goes: the rename over it fails.
    QVERIFY(MakeDirectories(path + ".bak/blocker").ok());
    nlohmann::json doc = s.Document();
    doc["shadow"]["enabled"] = false;
    ReplaceOutcome o = s.Replace(doc);
    QVERIFY(!o.ok());
    QVERIFY(o.error->kind == SettingsError::Kind::kIo);
    QCOMPARE(o.error->http_status(), 500);
    QVERIFY2(o.error->message.find("rename " + path + ".bak.tmp") != std::string::npos, o.error->message.c_str());
    QCOMPARE(s.version(), int64_t{1});
    QCOMPARE(s.Document()["shadow"]["enabled"].get<bool>(), true);
    QVERIFY(!FileExists(path));
    QCOMPARE(calls, 0);
  }

  void operationsDocListsEveryField() {
    Result<std::string> text = ReadFile(std::string(ANCHORAGE_SOURCE_DIR) + "/docs/operations.md");
    QVERIFY2(text.ok(), text.status().ToString().c_str());
    for (const SettingField& f : SettingsSchemaFields(k64GiB)) {
      std::string needle = "`";
      needle += f.key();
      needle += '`';
      QVERIFY2(text->find(needle) != std::string::npos, f.key().c_str());
    }
  }
};

QTEST_APPLESS_MAIN(TestSettings)
#include "test_settings.moc"
