// Immutable value snapshots of the engine that EngineHost publishes to the GUI thread by signal.
#pragma once

#include <QByteArray>
#include <QHash>
#include <QJsonObject>
#include <QList>
#include <QMetaType>
#include <QString>
#include <QStringList>

#include "engine/core/request_figures.h"

// One cache tier as of the last job or command; bytes in bytes.
struct CacheTierSnapshot {
  QString tier;           // "resident", "anchors", "end", "stash", "pin", "park"
  qint64 entries = 0;     // entries held (rows for the resident prefix)
  qint64 bytes = 0;       // bytes held now
  qint64 budgetBytes = 0; // 0 when the tier has no budget of its own
  qint64 hits = 0;        // resumes served from this tier
  qint64 evictions = 0;   // entries evicted by the budget
};

// One engine slot: a conversation that runs beside the others.
struct SlotRowSnapshot {
  int slot = 0;
  QString session;
  qint64 tokens = 0;  // rows its state holds
  qint64 bytes = 0;   // what it holds for the memory budget
  QString state;      // "idle", "prefill", "decode"
  qint64 requests = 0;
};

// Every resident tier at one moment; timeMs is Unix epoch milliseconds.
struct CacheSnapshot {
  qint64 timeMs = 0;
  QList<CacheTierSnapshot> tiers;
  qint64 engineBytes = 0;   // everything the engine holds (state buffer and caches); 0 when not reported
  qint64 ceilingBytes = 0;  // memory.ceiling_gb in force
  qint64 peakBytes = 0;     // memory.prefill_peak_gb in force
  qint64 sheds = 0;         // cache entries shed to fit the budget, since start
  qint64 refused = 0;       // prefills refused with 503, since start
  qint64 deviceBytes = 0;   // GPU memory the backend holds; 0 on the CPU
  QList<SlotRowSnapshot> slotRows;
  QByteArray json;  // GET /v1/cache/stats as the engine reports it
};

// The shadow reader at one moment: GET /v1/shadow/status's document ({"loaded": false, ...} without one).
struct ShadowSnapshot {
  qint64 timeMs = 0;
  QByteArray json;
};

// The backends at one moment: /health's "backends" array, and every model id the endpoint serves
// (the embedded model first, then the backends').
struct BackendsSnapshot {
  qint64 timeMs = 0;
  QByteArray json;
  QStringList models;
};

// One journal row (a request, a cache event or a shadow agreement).
struct JournalRowSnapshot {
  qint64 id = 0;
  qint64 timeMs = 0;
  QString type;     // "request", "cache_event" or "shadow"
  QString kind;     // "request" or the event kind ("hit", "shed", ...)
  QString tier;
  QString session;
  qint64 tokens = 0;  // prompt tokens of a request, tokens of an event
  int status = 0;     // HTTP status of a request; 0 for events
  QString route;          // a request's route ("/v1/chat/completions")
  QString finishReason;   // a request's finish reason ("stop", "length", ...)
  qint64 outputTokens = 0;
  int slot = 0;           // a request's engine slot
  double queueMs = 0;     // a request's wait in the queue
  qint64 queuePosition = 0;  // its place among the requests waiting for a slot when it came (1: next); 0: none waited
  double ttftMs = 0;
  double decodeTokensPerS = 0;
  QString text;       // error of a request, reason of an event
  QByteArray json;    // the row as Journal::Query returns it
};

// The newest journal rows, newest first.
struct JournalSnapshot {
  QList<JournalRowSnapshot> rows;
  qint64 total = 0;  // rows in the journal
};


// The engine's state for the status bar.
struct EngineStatusSnapshot {
  bool ready = false;
  QString modelId;
  QString kernelPath;  // the CPU kernels' path ("avx2-fma"), or "cuda" where a GPU runs the model
  QString weights;     // how the matrices are held ("bf16", "fp8-e4m3 + bf16", "int8")
  QString kvDtype;     // how states keep their K/V rows ("bf16", "fp8", "f32")
  QString precision;   // how products run: "exact", or "fast" (bf16-rounded activations on bf16 units)
  bool generatedModel = false;  // the embedded model is the generated tiny one (random weights)
  int threads = 0;     // the engine's worker threads
  QString url;      // the endpoint, http://HOST:PORT/v1
  int queueDepth = 0;
  int slotCount = 1;  // sequences the engine runs at once
  int busySlots = 0;
  bool busy = false;
  QString phase = "idle";     // "idle", "prefill", "decode" (the console's chat), "busy" (an endpoint request)
  double liveTokensPerS = 0;  // decode: tokens a second of the console's streaming answer so far
  QString resumeHint;         // prefill: where it resumed ("end at 412 tokens"), from the journal's hit row
  anchorage::RequestFigures last;  // the last finished job
  QStringList notes;          // what the engine's start said besides its progress (warnings, overrides)
  QString fingerprint;        // the model's (hex sha256 over weights, config and tokenizer)
  qint64 journalErrors = 0;   // failed background writes of the journal so far
  QString journalLastError;
};

// The settings document (what PUT /v1/settings edits) and its schema.
struct SettingsSnapshot {
  qint64 version = 0;
  QJsonObject document;  // {"version", areas...} with "overrides" when set
  QJsonObject schema;    // {"version", "areas": {area: {field: {type, min, max, default, description}}}}
};

// The answer to a settings change: ok, or the HTTP status (400, 409, 500) and the error text.
struct SettingsOutcome {
  bool ok = false;
  int httpStatus = 200;
  qint64 version = 0;
  QString message;  // the error's message and every bad field, one a line
};

// Whether the routes the screens read answer (over --connect): a screen fed by a failing route is
// greyed with the reason. Routes by path without the query ("/v1/journal").
struct AvailabilitySnapshot {
  bool reachable = true;             // /health answered at its last read
  QHash<QString, QString> failing;   // route -> why its last read failed
  QHash<QString, qint64> lastOkMs;   // route -> when it last answered (Unix ms)
  QString adminRefusal;              // why the admin routes (clears, settings edits) will be refused; empty: they pass
};

// One piece of a streamed chat answer.
struct ChatDelta {
  QString conversation;
  QString reasoning;  // reasoning_content text of this event
  QString content;    // content text of this event
};

// Figures of one finished chat turn, from usage.anchorage.
struct ChatTurnStats {
  QString conversation;
  bool ok = true;
  bool stopped = false;  // aborted by the operator
  QString error;
  anchorage::RequestFigures figures;  // from usage and usage.anchorage
  QString finishReason;
};

Q_DECLARE_METATYPE(CacheSnapshot)
Q_DECLARE_METATYPE(ShadowSnapshot)
Q_DECLARE_METATYPE(BackendsSnapshot)
Q_DECLARE_METATYPE(JournalSnapshot)
Q_DECLARE_METATYPE(EngineStatusSnapshot)
Q_DECLARE_METATYPE(SettingsSnapshot)
Q_DECLARE_METATYPE(SettingsOutcome)
Q_DECLARE_METATYPE(AvailabilitySnapshot)
Q_DECLARE_METATYPE(ChatDelta)
Q_DECLARE_METATYPE(ChatTurnStats)
