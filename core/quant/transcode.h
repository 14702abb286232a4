// Lossless MXFP4 -> NVFP4A16 transcoding (docs/formats.md §5, §9, docs/quant.md "Transcode").
//
// Packed nibbles are copied unchanged; each 16-block of an active group j gets the E4M3 scale
// 2^(k_j - k_max + 8), k_max shared per fused group (w1/w3 share it), and the global scale is
// 2^(k_max - 8) in effect. Two layouts write this one cast (TranscodeLayout): compressed-tensors
// stores the global as its divisor 2^(8 - k_max) and all-zero groups as +0; ModelOpt stores it
// as the multiplier `weight_scale_2` 2^(k_max - 8) and all-zero groups as 1.0. A gpt-oss MXFP4
// source (transformers' `X_blocks`/`X_scales`) goes to ModelOpt's gpt-oss layout only, one
// stacked tensor at a time through gptoss::CastToModelOpt (gpt_oss_cast.h). Nothing is ever
// requantized: an over-span or NaN-scale source fails with FAILED_PRECONDITION naming tensor,
// row and group, and nothing is published.
//
// The source is read once through the bounded streaming engine (core/io/tree_stream.h): shard
// by shard and fused group by fused group, in `memory_window`, on `threads`. Each output shard
// is laid out from the source header alone and every tensor is written at its offset as soon
// as it is derived; as soon as its last byte is in, the shard is hashed from the file while its
// fsync runs, on threads beside the stream. Index, config and the
// carried small files come last; the output is built in a temporary directory beside DST
// (".DST.transcode-tmp", 0700, holding a run record) and renamed to DST, and the parent is
// fsynced, so DST appears complete or not at all. A lock file in the parent
// (".DST.transcode.lock", flock) keeps a second transcode to DST out.
//
// An interrupted run (killed, disk full, I/O error) leaves its temporary directory; `resume`
// continues it: every output shard already there is compared, byte for byte, with what the
// transcoder derives from the source bytes read now, and rewritten where it differs, so the
// result is byte-identical to an uninterrupted run whatever the kill left (docs/quant.md). Only
// a directory this user alone can have written is continued (owned by the user, 0700, every
// entry a regular file of the user with one link).
#ifndef CKPT_CORE_QUANT_TRANSCODE_H_
#define CKPT_CORE_QUANT_TRANSCODE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/io/tree_image.h"
#include "core/progress.h"
#include "core/quant/scale_window.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant {

// How the output names and encodes the cast (docs/quant.md "Transcode"):
//   kCompressedTensors  M.weight_packed U8, M.weight_scale F8_E4M3, M.weight_global_scale F32 [1];
//                       quantization_config format nvfp4-pack-quantized
//   kModelOpt           M.weight U8, M.weight_scale F8_E4M3, M.weight_scale_2 F32 [];
//                       hf_quant_config.json and a quant_method "modelopt" quantization_config,
//                       quant_algo W4A16_NVFP4 (docs/formats.md §9)
enum class TranscodeLayout { kCompressedTensors, kModelOpt };
std::string TranscodeLayoutName(TranscodeLayout layout);  // "compressed-tensors" | "modelopt"
// INVALID_ARGUMENT for any other name.
absl::StatusOr<TranscodeLayout> ParseTranscodeLayout(const std::string& name);

struct TranscodeOptions {
  TranscodeLayout layout = TranscodeLayout::kCompressedTensors;
  ScaleWindowConfig policy;
  unsigned threads = 0;  // 0 = all cores
  uint64_t memory_window = kDefaultMemoryWindow;
  bool resume = false;  // continue the interrupted run's temporary directory
};

struct TranscodeResult {
  TranscodeLayout layout = TranscodeLayout::kCompressedTensors;
  ScaleWindowResult policy;
  std::vector<std::string> files;  // written, relative to DST
  uint64_t tensors_written = 0, modules_transcoded = 0, bytes_written = 0;
  uint64_t zero_groups_canonicalized = 0;
  std::string zero_group_scale;  // the block scale written on all-zero groups: "+0" or "1.0"
  // resume: output shards of the interrupted run that equalled the derived bytes (kept) and
  // those rewritten where they differed (redone).
  uint64_t shards_kept = 0, shards_redone = 0;
  nlohmann::json ToJson() const;

  // Not in ToJson. The source as read (every file's SHA-256, taken from the bytes transcoded),
  // the published output (its real path, every file's size and SHA-256, taken as written) and
  // the stream's figures.
  std::shared_ptr<const TreeImage> source;
  std::shared_ptr<const TreeImage> output;
  uint64_t bytes_read = 0, peak_kept_bytes = 0;
};

// The NVFP4 form of a compressed-tensors MXFP4 quantization_config (group 16, tensor_group).
nlohmann::json Nvfp4QuantizationConfig(const nlohmann::json& mxfp4_config);

// Errors: INVALID_ARGUMENT (source neither compressed-tensors MXFP4 nor gpt-oss MXFP4 (the
// latter with kModelOpt only, its stacked tensors fitting its config), DST exists, a bad DST
// name, an interrupted run's temporary directory without `resume`, two output tensors of one
// name; for kModelOpt, a module the exclude list cannot name without also excluding a quantized
// one),
// NOT_FOUND (DST's parent is missing; `resume` without a temporary directory),
// FAILED_PRECONDITION (the source is not transcodable: over-span or NaN scale; in the
// compressed-tensors layout, a global beyond F32; `resume` of a temporary directory that another
// user could have written), ALREADY_EXISTS (the temporary
// name is a link, not a directory, or another run's: another target, layout, policy or
// source), ABORTED (another transcode to DST holds the lock; `resume` after the source
// changed), RESOURCE_EXHAUSTED (a unit over the window), DATA_LOSS (I/O, naming file and
// offset; the temporary directory is kept for `resume`).
absl::StatusOr<TranscodeResult> TranscodeToNvfp4(const std::string& src, const std::string& dst,
                                                 const TranscodeOptions& options,
                                                 Progress& progress);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_TRANSCODE_H_
