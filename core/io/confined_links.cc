#include "core/io/confined_links.h"

#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/text/name_encoding.h"

namespace ckpt::io {
namespace {

using Components = std::vector<std::string>;

Components Split(const std::string& absolute) {
  return absl::StrSplit(absolute, '/', absl::SkipEmpty());
}

std::string Join(const Components& c) { return absl::StrCat("/", absl::StrJoin(c, "/")); }

bool IsPrefix(const Components& prefix, const Components& path) {
  if (prefix.size() > path.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (prefix[i] != path[i]) return false;
  }
  return true;
}

}  // namespace

LinkResolver::LinkResolver(std::vector<LinkBase> bases, std::string scope,
                           std::vector<std::string> allowed)
    : bases_(std::move(bases)), scope_(std::move(scope)), allowed_(std::move(allowed)) {}

absl::StatusOr<std::shared_ptr<const Directory>> LinkResolver::DirectoryAt(const Components& path,
                                                                           const LinkBase& b) {
  const std::string key = Join(path);
  if (auto it = opened_.find(key); it != opened_.end()) return it->second;
  std::shared_ptr<const Directory> dir;
  if (path.size() <= Split(b.path).size()) {
    dir = b.dir;
  } else {
    auto parent = DirectoryAt(Components(path.begin(), path.end() - 1), b);
    if (!parent.ok()) return parent.status();
    auto opened = (*parent)->OpenDirectory(path.back());
    if (!opened.ok()) return opened.status();
    dir = std::shared_ptr<const Directory>(*std::move(opened));
  }
  opened_[key] = dir;
  return dir;
}

absl::StatusOr<ResolvedLink> LinkResolver::Resolve(std::shared_ptr<const Directory> dir,
                                                   const std::string& dir_path,
                                                   const std::string& name) {
  const std::string link = EncodeName(absl::StrCat(dir_path, "/", name));
  Components cur = Split(dir_path);
  opened_.emplace(Join(cur), std::move(dir));
  std::deque<std::string> todo = {name};
  ResolvedLink out;
  std::string text0;  // the link's own text, for messages
  auto refuse = [&](const Components& at, const std::string& why) {
    std::string target = Join(at);
    if (!todo.empty()) absl::StrAppend(&target, "/", absl::StrJoin(todo, "/"));
    return absl::PermissionDeniedError(absl::StrCat(link, " -> ", EncodeName(text0),
                                                    ": resolves to ", EncodeName(target), ", ",
                                                    why));
  };
  while (!todo.empty()) {
    const std::string c = todo.front();
    todo.pop_front();
    if (c.empty() || c == ".") continue;
    if (c == "..") {
      if (!cur.empty()) cur.pop_back();
      continue;
    }
    Components next = cur;
    next.push_back(c);
    const LinkBase* inside = nullptr;
    bool above = false;  // `next` is a base or a directory above one: a real directory
    for (const LinkBase& b : bases_) {
      const Components bp = Split(b.path);
      if (bp.size() < next.size() && IsPrefix(bp, next)) inside = inside ? inside : &b;
      if (IsPrefix(next, bp)) above = true;
    }
    if (inside == nullptr) {
      if (!above) return refuse(next, absl::StrCat("outside ", scope_));
      if (todo.empty()) return refuse(next, "a directory, not a regular file");
      cur = std::move(next);
      continue;
    }
    auto d = DirectoryAt(cur, *inside);
    if (!d.ok()) return refuse(cur, std::string(d.status().message()));
    auto text = (*d)->ReadLink(c);
    if (text.ok()) {
      if (out.hops.size() >= kMaxLinks) return refuse(next, "through too many links");
      if (out.hops.empty()) text0 = *text;
      if (text->empty()) return refuse(next, "an empty link");
      out.hops.push_back({*d, c, *text});
      if ((*text)[0] == '/') cur.clear();
      Components parts = absl::StrSplit(*text, '/');
      todo.insert(todo.begin(), parts.begin(), parts.end());
      continue;
    }
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat(link, " -> ", EncodeName(text0), ": ",
                                              EncodeName(Join(next)), " does not exist"));
    }
    if (!absl::IsInvalidArgument(text.status())) return text.status();
    if (!todo.empty()) {  // must be a directory to go on
      if (auto sub = DirectoryAt(next, *inside); !sub.ok()) {
        return refuse(next, std::string(sub.status().message()));
      }
      cur = std::move(next);
      continue;
    }
    auto file = (*d)->OpenFile(c);
    if (!file.ok()) return refuse(next, std::string(file.status().message()));
    auto id = (*file)->Identity();
    if (!id.ok()) return id.status();
    out.target = Join(next);
    if (!allowed_.empty()) {
      bool ok = false;
      for (const std::string& a : allowed_) ok = ok || IsPrefix(Split(a), next);
      if (!ok) {
        return absl::PermissionDeniedError(
            absl::StrCat(link, " -> ", EncodeName(text0), ": resolves to ",
                         EncodeName(out.target), ", outside the allowed roots"));
      }
    }
    out.parent = *d;
    out.leaf = c;
    out.size = id->size;
    return out;
  }
  return refuse(cur, "a directory, not a regular file");
}

absl::Status CheckLinksUnchanged(const std::vector<LinkHop>& hops) {
  for (const LinkHop& h : hops) {
    auto text = h.dir->ReadLink(h.name);
    if (!text.ok() || *text != h.text) {
      return absl::DataLossError(absl::StrCat(EncodeName(h.dir->label()), "/", EncodeName(h.name),
                                              ": symbolic link changed after it was followed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::io
