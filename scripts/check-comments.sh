#!/usr/bin/env bash
# Comments say why the code is as it is now; the history of how it got there belongs in
# commit messages. This fails on the unambiguous marks of a lab notebook in the comments
# of Sources/ and Package.swift: a work session, round or issue number, a profiler's name
# as a source ("(strace)", "(perf)", callgrind), "measured with ...", "profiling showed",
# a date. Only comments are read: a small lexer skips string literals (single-line,
# multi-line, raw, with interpolations), so help text and URLs such as s3://BUCKET never
# count. A date followed by `T` is an example of a time format (2026-11-22T13:45:01Z), and
# a project's own tracker (libfuse issue #586) is a reference, not history: both pass.
# Prints each hit as file:line: comment, and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t files < <({ echo Package.swift; find Sources -type f \( -name '*.swift' -o -name '*.c' -o -name '*.h' \); } | sort)

# shellcheck disable=SC2016 # the awk program is literal
awk '
FNR == 1 { mode = "code"; depth = 0; sp = 0 }
{
    line = $0; n = length(line); comment = ""; i = 1
    if (mode == "str" || mode == "raw") mode = "code"   # a single-line string ends with its line
    while (i <= n) {
        c = substr(line, i, 1); c2 = substr(line, i, 2); c3 = substr(line, i, 3)
        if (mode == "block") {
            if (c2 == "/*") { depth++; i += 2; continue }
            if (c2 == "*/") { depth--; i += 2; if (depth == 0) mode = "code"; comment = comment " "; continue }
            comment = comment c; i++; continue
        }
        if (mode == "str" || mode == "mstr") {
            if (c == "\\") {
                if (substr(line, i + 1, 1) == "(") { stack[++sp] = mode; parens[sp] = 1; mode = "code"; i += 2; continue }
                i += 2; continue
            }
            if (mode == "mstr" && c3 == "\"\"\"") { mode = "code"; i += 3; continue }
            if (mode == "str" && c == "\"") { mode = "code"; i++; continue }
            i++; continue
        }
        if (mode == "raw" || mode == "mraw") {
            if (mode == "mraw" && substr(line, i, 4) == "\"\"\"#") { mode = "code"; i += 4; continue }
            if (mode == "raw" && c2 == "\"#") { mode = "code"; i += 2; continue }
            i++; continue
        }
        # code
        if (c2 == "//") { comment = comment substr(line, i + 2); break }
        if (c2 == "/*") { mode = "block"; depth = 1; i += 2; continue }
        if (substr(line, i, 4) == "#\"\"\"") { mode = "mraw"; i += 4; continue }
        if (c2 == "#\"") { mode = "raw"; i += 2; continue }
        if (c3 == "\"\"\"") { mode = "mstr"; i += 3; continue }
        if (c == "\"") { mode = "str"; i++; continue }
        if (sp > 0) {   # inside an interpolation: its closing parenthesis resumes the string
            if (c == "(") parens[sp]++
            else if (c == ")" && --parens[sp] == 0) { mode = stack[sp--]; i++; continue }
        }
        i++
    }
    if (comment == "") next
    sub(/^[ \t\/!]+/, "", comment)
    text = tolower(comment)
    gsub(/(libfuse|sqlite|swift|glibc|kernel) issue #?[0-9]+/, "", text)
    if (text ~ /(^|[^a-z0-9_])session [0-9]/ ||
        text ~ /(^|[^a-z0-9_])round [0-9]/ ||
        text ~ /(^|[^a-z0-9_])issues? #?[0-9]/ ||
        text ~ /(^|[^a-z0-9_])issue #/ ||
        text ~ /(\(|, ?|^ *)(strace|perf|ltrace)(\)|,)/ ||
        text ~ /callgrind/ ||
        text ~ /(^|[^a-z0-9_])perf showed/ ||
        text ~ /measured (with|by|in)([^a-z]|$)/ ||
        text ~ /profil(ed|ing) (run|showed)/ ||
        text ~ /showed in the profile/ ||
        text ~ /20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]([^t0-9]|$)/) {
        printf "%s:%d: %s\n", FILENAME, FNR, comment
        hits++
    }
}
END { exit hits > 0 }
' "${files[@]}" && status=0 || status=$?

if [ "$status" -eq 0 ]; then
    echo "check-comments: OK (${#files[@]} files, no history or measurement story in comments)"
else
    echo "check-comments: comments above tell history; say why the code is as it is now" >&2
    exit 1
fi
