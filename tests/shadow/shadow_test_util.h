// Helpers of the shadow tests: the generated tiny (main) and shadow models, and a fresh grid prefill.
#pragma once

#include <QTemporaryDir>

#include <memory>
#include <span>

#include "engine/model/model.h"
#include "engine/model/tiny_model.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage::testing {

struct ShadowModels {
  QTemporaryDir main_dir, shadow_dir;
  std::unique_ptr<Model> main;

  bool Make() {
    if (!GenerateTinyModel(TinyModelSize::kTiny, 3, main_dir.path().toStdString()).ok()) return false;
    if (!GenerateTinyModel(TinyModelSize::kShadow, 5, shadow_dir.path().toStdString()).ok()) return false;
    auto m = LoadModel(main_dir.path().toStdString());
    if (!m.ok()) return false;
    main = std::move(m).value();
    return true;
  }
  std::unique_ptr<Model> LoadShadow() const {
    auto m = LoadModel(shadow_dir.path().toStdString());
    return m.ok() ? std::move(m).value() : nullptr;
  }
};

// A state of ids prefilled from nothing in one call on the forward's grid.
inline std::unique_ptr<SequenceState> FreshPrefill(Forward& forward, std::span<const int32_t> ids) {
  auto state = std::make_unique<SequenceState>(forward.config());
  if (!ids.empty() && !forward.Prefill(*state, ids).ok()) return nullptr;
  return state;
}

}  // namespace anchorage::testing
