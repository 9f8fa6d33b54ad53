// Prompt cleaning of the Wan reference (spec §4.3, wan/modules/tokenizers.py, clean='whitespace'):
//   1. ftfy.fix_text(text)            (ftfy 6.x defaults; see ftfy_fix_text for what is covered)
//   2. html.unescape(html.unescape(text))
//   3. strip; 4. re.sub(r'\s+', ' '); 5. strip   (Python's Unicode whitespace, see is_py_space)
// Every function here reproduces the named Python function on valid text; the tests compare them
// with the Python oracle on fixed and fresh random prompts (tests/cpu/test_tokenizer.cpp).
//
// ftfy coverage. Implemented exactly: the per-line segmentation with the sticky "'<' in a line
// turns HTML unescaping off for the rest of the text" rule, the fixed-point loop, unescape_html
// (ftfy's own: html5 names with ';', its all-caps variants, numeric references), fix_encoding
// (mojibake: the ten single-byte codecs, restore_byte_a0, replace_lossy_sequences, utf-8-variants,
// decode_inconsistent_utf8, the Latin-1/Windows-1252 rule and the badness heuristic),
// fix_c1_controls, fix_latin_ligatures, fix_character_width, uncurl_quotes, fix_line_breaks,
// remove_terminal_escapes, remove_control_chars and NFC.
// Not covered: fix_surrogates (a UTF-8 string cannot hold surrogates, so it is the identity here)
// and ftfy's 1,000,000-code-point split of a line without line breaks (lines are never split).
#pragma once
#include <string>
#include <string_view>

namespace wan::text {

// The whole cleaning (steps 1-5), UTF-8 in and out; invalid UTF-8 input bytes become U+FFFD first.
std::string clean_prompt(std::string_view prompt);

// Python's html.unescape (HTML5 named references incl. the legacy ones without ';' and longest-
// prefix matching, numeric references with the HTML5 replacement rules).
std::u32string html_unescape(std::u32string_view s);

// ftfy.fix_text with its default configuration.
std::u32string ftfy_fix_text(std::u32string_view s);

// Individual ftfy fixers (ftfy.fixes.*), exposed for the tests.
std::u32string ftfy_unescape_html(std::u32string_view s);
std::u32string ftfy_fix_encoding(std::u32string_view s);  // ftfy.fix_encoding
bool ftfy_is_bad(std::u32string_view s);                  // ftfy.badness.is_bad
std::u32string ftfy_fix_c1_controls(std::u32string_view s);

// Steps 3-5: strip, collapse whitespace runs to one ' ', strip.
std::u32string whitespace_clean(std::u32string_view s);

}  // namespace wan::text
