#include "core/progress.h"

namespace ckpt {
namespace {

class NullProgress final : public Progress {
 public:
  void Begin(std::string_view, uint64_t) override {}
  void Advance(uint64_t) override {}
  void End() override {}
};

}  // namespace

Progress& NoProgress() {
  static NullProgress p;
  return p;
}

}  // namespace ckpt
