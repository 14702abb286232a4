// Block inputs and results on disk, as safetensors files laid out like the oracle
// (tests/data/oracle/mini-kimi-block-L1.safetensors): `input` BF16 [T, hidden], the
// intermediates in the run's precision (F64, or F32 for f32/bf16), `topk_ids` I32.
#ifndef CKPT_CORE_FORWARD_BLOCK_IO_H_
#define CKPT_CORE_FORWARD_BLOCK_IO_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/forward/block_forward.h"

namespace ckpt::forward {

// Reads tensor `input` (BF16 [T, hidden]). INVALID_ARGUMENT naming the file otherwise.
absl::StatusOr<BlockInput> ReadBlockInput(const std::string& path, int hidden);

// A deterministic input: element i of [tokens, hidden] is the BF16 rounding of a uniform value
// in [-2, 2) drawn from splitmix64(seed + i) (docs/forward.md).
BlockInput SeededInput(int64_t tokens, int hidden, uint64_t seed);

// The input's BF16 bytes, little-endian row-major (what an --input file would hold).
std::vector<uint8_t> InputBytes(const BlockInput& in);

// Writes input, intermediates and output. `metadata` goes into __metadata__.
absl::Status WriteBlockResult(const std::string& path, const BlockConfig& config,
                              const BlockInput& input, const BlockResult& result, Precision p,
                              const std::map<std::string, std::string>& metadata);

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_BLOCK_IO_H_
