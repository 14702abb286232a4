// How names that are not text are recorded: file paths, roots and tensor names that reach JSON,
// protobuf strings or a terminal (docs/evidence.md, "Name encoding").
//
// A POSIX file name is any byte string without '/' and NUL; JSON and proto3 `string` hold only
// valid UTF-8. A name that is valid UTF-8 and holds no NUL is recorded as is, so ordinary names
// stay byte-identical to what OpenSSF model_signing records. Any other name is recorded with
// every byte that is not part of a valid UTF-8 sequence, every NUL and every '%' written as
// "%XX" (two upper-case hex digits). Only the recorded form is encoded: files are still opened
// by their raw bytes.
//
// The encoding is not injective over all names: the valid name "a%FF" and the raw name
// "a\xFF" both record as "a%FF". Whoever records a set of names (a tree listing, a header's
// tensors) calls CheckNoEncodingCollisions and refuses such a set.
#ifndef CKPT_CORE_TEXT_NAME_ENCODING_H_
#define CKPT_CORE_TEXT_NAME_ENCODING_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

// Well-formed UTF-8 (Unicode 15, table 3-7): no overlong forms, no surrogates (ED A0..BF), no
// code point above U+10FFFF, no truncated sequence. NUL is valid UTF-8.
bool IsValidUtf8(std::string_view s);

// The recorded form of `raw`: `raw` itself when it is valid UTF-8 without NUL, else the
// percent-escaped form described above. Always valid UTF-8 without NUL.
std::string EncodeName(std::string_view raw);

// The raw name that `encoded` records. A string that is the escaped form of a name needing
// escaping decodes to that name; any other valid string decodes to itself (it was recorded as
// is), so where both readings exist the escaped one wins (see CheckNoEncodingCollisions).
// INVALID_ARGUMENT when `encoded` is not valid UTF-8 or holds NUL: nothing encodes to it.
absl::StatusOr<std::string> DecodeName(std::string_view encoded);

// INVALID_ARGUMENT naming both names when two different raw names in `raw_names` have the same
// recorded form (a valid name spelled like the escaped form of another).
absl::Status CheckNoEncodingCollisions(const std::vector<std::string>& raw_names);

}  // namespace ckpt

#endif  // CKPT_CORE_TEXT_NAME_ENCODING_H_
