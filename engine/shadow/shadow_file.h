// One shadow session on disk: the disk caches' file format (kind "shadow", the shadow's state
// fingerprint and grid), with its ids, the K/V rows below the committed length, the recurrent
// state, the checkpoints and the lines still to checkpoint. Written crash-safe; any damage is a
// Corrupt status and the caller reads the session again from the start.
#pragma once

#include <memory>
#include <string>

#include "engine/cache/disk_env.h"
#include "engine/shadow/shadow_session.h"

namespace anchorage {

// "<sha256 of the session id, 32 hex>.shadow"
std::string ShadowFileName(const std::string& session);

Status SaveShadowFile(DiskEnv& env, const std::string& path, const std::string& fingerprint, const std::string& session,
                      const ShadowSession& s);
// Reads a file SaveShadowFile wrote for this session under this fingerprint (another model, grid
// or session is a Corrupt status).
Result<std::unique_ptr<ShadowSession>> LoadShadowFile(DiskEnv& env, const std::string& path, const ModelConfig& config,
                                                      int64_t grid_tokens, const std::string& fingerprint, const std::string& session);

}  // namespace anchorage
