// Unigram Viterbi of the tokenizers library (see unigram.h). Vocabulary lookup: the pieces sorted
// bytewise; the pieces that start with the first k bytes at a position form one contiguous range,
// narrowed byte by byte, so every match at a position is found in increasing length order (the
// order tokenizers' trie reports them, which decides ties).
#include "text/unigram.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace wan::text {

namespace {

size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

}  // namespace

UnigramModel::UnigramModel(std::vector<Piece> vocab, int unk_id, bool byte_fallback)
    : unk_id_(unk_id), byte_fallback_(byte_fallback) {
  WAN_CHECK(!vocab.empty(), "unigram vocabulary is empty");
  WAN_CHECK(unk_id >= 0 && unk_id < static_cast<int>(vocab.size()), "unigram unk id ", unk_id, " out of range");
  double min_score = std::numeric_limits<double>::infinity();
  score_.resize(vocab.size());
  std::vector<Entry> entries;
  entries.reserve(vocab.size());
  for (size_t i = 0; i < vocab.size(); ++i) {
    score_[i] = vocab[i].score;
    min_score = std::min(min_score, vocab[i].score);
    entries.push_back({std::move(vocab[i].text), static_cast<int>(i)});
  }
  unk_score_ = min_score - 10.0;
  // Sort by text; for a duplicated text the LAST id wins (tokenizers' token_to_ids map).
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.text < b.text; });
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].text.empty()) continue;
    if (i + 1 < entries.size() && entries[i + 1].text == entries[i].text) continue;
    sorted_.push_back(std::move(entries[i]));
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_id_[b] = find(name);
  }
}

int UnigramModel::find(std::string_view text) const {
  const auto it = std::lower_bound(sorted_.begin(), sorted_.end(), text,
                                   [](const Entry& e, std::string_view t) { return std::string_view(e.text) < t; });
  return (it != sorted_.end() && it->text == text) ? it->id : -1;
}

void UnigramModel::encode(std::string_view s, std::vector<int32_t>& out) const {
  const size_t n = s.size();
  if (n == 0) return;
  struct Node {
    int id = -1;
    double score = 0.0;
    int64_t start = -1;  // -1: no path reaches this position yet
  };
  std::vector<Node> best(n + 1);
  for (size_t start = 0; start < n;) {
    const double base = best[start].score;
    const size_t mblen = std::min(utf8_len(static_cast<unsigned char>(s[start])), n - start);
    bool has_single = false;
    // Range of pieces sharing the first k bytes at `start`.
    auto lo = sorted_.begin(), hi = sorted_.end();
    for (size_t k = 0; start + k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[start + k]);
      // Pieces longer than k whose byte k is c (shorter pieces sort first and drop out).
      lo = std::partition_point(lo, hi, [&](const Entry& e) {
        return e.text.size() <= k || static_cast<unsigned char>(e.text[k]) < c;
      });
      hi = std::partition_point(lo, hi, [&](const Entry& e) { return static_cast<unsigned char>(e.text[k]) == c; });
      if (lo == hi) break;
      if (lo->text.size() == k + 1) {  // exact match of s[start, start + k + 1)
        const size_t end = start + k + 1;
        const double cand = base + score_[static_cast<size_t>(lo->id)];
        if (best[end].start < 0 || cand > best[end].score) best[end] = {lo->id, cand, static_cast<int64_t>(start)};
        if (k + 1 == mblen) has_single = true;
      }
    }
    if (!has_single) {
      const size_t end = start + mblen;
      const double cand = base + unk_score_;
      if (best[end].start < 0 || cand > best[end].score) best[end] = {unk_id_, cand, static_cast<int64_t>(start)};
    }
    start += mblen;
  }
  // Backtrack; fuse runs of unknown nodes into one string.
  struct Tok {
    size_t b, e;
    int id;  // -1 = fused unknown
  };
  std::vector<Tok> toks;
  for (size_t end = n; end > 0;) {
    const Node& nd = best[end];
    WAN_ASSERT(nd.start >= 0, "unigram lattice has no path");
    const auto b = static_cast<size_t>(nd.start);
    if (nd.id == unk_id_) {
      if (!toks.empty() && toks.back().id == -1)
        toks.back().b = b;
      else
        toks.push_back({b, end, -1});
    } else {
      toks.push_back({b, end, nd.id});
    }
    end = b;
  }
  std::reverse(toks.begin(), toks.end());
  for (const Tok& t : toks) {
    if (t.id >= 0) {
      out.push_back(find(s.substr(t.b, t.e - t.b)));  // by text, as tokenizers maps strings to ids
      continue;
    }
    const std::string_view text = s.substr(t.b, t.e - t.b);
    const int id = find(text);
    if (id >= 0) {
      out.push_back(id);
    } else if (byte_fallback_ &&
               std::all_of(text.begin(), text.end(), [&](char ch) { return byte_id_[static_cast<unsigned char>(ch)] >= 0; })) {
      for (char ch : text) out.push_back(byte_id_[static_cast<unsigned char>(ch)]);
    } else {
      out.push_back(unk_id_);
    }
  }
}

}  // namespace wan::text
