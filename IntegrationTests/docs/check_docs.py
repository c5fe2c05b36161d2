#!/usr/bin/env python3
"""Checks that the documentation tells the truth about the binary and the tree.

    check_docs.py UBIQUITY_BINARY REPO_ROOT

1. Every `ubiquity ...` command in README.md's code blocks names a subcommand that exists
   (`ubiquity SUB --help` succeeds) and only options that SUB's help lists.
2. Every relative link in README.md and docs/*.md resolves: the file exists and, for a
   `#anchor`, a heading with that GitHub-style anchor exists in it.
3. Help text wraps without breaking sentences: at a width no paragraph reaches
   (COLUMNS=1000), no line of prose is followed by a line that continues its sentence.

Prints one line per problem and exits 1 if there is any.
"""
import os
import re
import shlex
import subprocess
import sys

problems = []


def problem(text):
    problems.append(text)
    print("FAIL: " + text)


def help_text(binary, words, columns=1000):
    env = dict(os.environ, COLUMNS=str(columns))
    run = subprocess.run([binary, *words, "--help"], capture_output=True, text=True, env=env, timeout=30)
    return run.returncode, run.stdout + run.stderr


# --- 1. README commands ---------------------------------------------------------------

def code_block_lines(markdown):
    """Lines inside ``` fences, and indented code blocks: lines of 4+ spaces after a blank
    line or after another such line."""
    lines, fenced, in_block, previous_blank = [], False, False, True
    for raw in markdown.splitlines():
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            lines.append(raw)
            continue
        indented = raw.startswith("    ") and raw.strip() != ""
        in_block = indented and (previous_blank or in_block)
        if in_block:
            lines.append(raw)
        previous_blank = raw.strip() == ""
    return lines


def commands_in(line):
    """The `ubiquity ...` invocations on a shell line, as word lists."""
    text = line.split(" # ")[0].strip()          # a comment after the command
    text = re.sub(r"^\$\s+", "", text)            # a prompt
    found = []
    for part in re.split(r"\s*(?:;|&&|\|\||\|)\s*", text):
        part = part.strip()
        if not part.startswith("ubiquity ") and part != "ubiquity":
            continue
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        found.append(words)
    return found


def subcommands(binary, words):
    """The subcommand names `ubiquity WORDS --help` lists."""
    code, text = help_text(binary, words)
    if code != 0:
        return None
    names, inside = set(), False
    for line in text.splitlines():
        if line.startswith("SUBCOMMANDS:"):
            inside = True
            continue
        if inside:
            if line and not line.startswith(" "):
                break
            m = re.match(r"^  ([a-z][a-z0-9-]*)\s{2,}\S", line)
            if m:
                names.add(m.group(1))
    return names


def check_readme_commands(binary, root):
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    checked = 0
    for line in code_block_lines(readme):
        for words in commands_in(line):
            args = words[1:]
            path = []
            # Walk down nested subcommands (`kv set`, `key list`) while the help lists them.
            while args:
                names = subcommands(binary, path)
                if names is None:
                    break
                if args[0] in names:
                    path.append(args.pop(0))
                else:
                    break
            if not path and args and not args[0].startswith("-"):
                problem(f"README: `{' '.join(words)}`: no subcommand {args[0]!r}")
                continue
            code, text = help_text(binary, path)
            if code != 0:
                problem(f"README: `{' '.join(words)}`: `ubiquity {' '.join(path)} --help` failed")
                continue
            for arg in args:
                if not arg.startswith("-") or arg == "-" or arg == "--":
                    continue
                flag = arg.split("=", 1)[0]
                if not re.search(r"(^|[\s,\[])" + re.escape(flag) + r"([\s,=<\]]|$)", text, re.M):
                    problem(f"README: `{' '.join(words)}`: `ubiquity {' '.join(path)}` has no option {flag}")
            checked += 1
    if checked < 10:
        problem(f"README: only {checked} ubiquity commands found in code blocks: is the extraction broken?")
    print(f"readme commands: {checked} checked")


# --- 2. Links --------------------------------------------------------------------------

def anchors(markdown):
    """GitHub's anchors for the headings of a markdown text."""
    result, seen = set(), {}
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = m.group(1).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", slug)  # GitHub drops punctuation but keeps - and _
        slug = slug.replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        result.add(slug if n == 0 else f"{slug}-{n}")
    return result


def check_links(root):
    files = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    checked = 0
    for name in files:
        text = open(os.path.join(root, name), encoding="utf-8").read()
        text_no_code = re.sub(r"```.*?```", "", text, flags=re.S)
        text_no_code = re.sub(r"`[^`\n]*`", "", text_no_code)
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text_no_code):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            base = os.path.dirname(os.path.join(root, name))
            full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(root, name)
            checked += 1
            if not os.path.exists(full):
                problem(f"{name}: link {target}: no such file")
                continue
            if anchor and full.endswith(".md"):
                if anchor not in anchors(open(full, encoding="utf-8").read()):
                    problem(f"{name}: link {target}: no heading with anchor #{anchor}")
    print(f"links: {checked} checked in {len(files)} files")


# --- 3. Help text wrapping -------------------------------------------------------------

def all_commands(binary, path=()):
    yield list(path)
    for name in sorted(subcommands(binary, list(path)) or []):
        if name == "help":
            continue
        yield from all_commands(binary, (*path, name))


def check_help_wrapping(binary):
    count = 0
    for path in all_commands(binary):
        code, text = help_text(binary, path)
        if code != 0:
            problem(f"`ubiquity {' '.join(path)} --help` failed")
            continue
        count += 1
        lines = text.splitlines()
        for a, b in zip(lines, lines[1:]):
            if not a.strip() or not b.strip():
                continue
            indent_a = len(a) - len(a.lstrip())
            indent_b = len(b) - len(b.lstrip())
            prose = re.match(r"^[a-z(`\"']", b.lstrip()) and not re.match(r"^(ubiquity|echo|ls|cat|cp|getfattr|systemctl|journalctl)\b", b.lstrip())
            # A sentence cut in two: a line of prose that does not end a sentence or
            # introduce a list, then a line at the same indent (the overview, at column 0)
            # or deeper (an option's help) that continues it in lower case.
            if prose and indent_b >= indent_a and not re.search(r"[.:;!?]$", a.rstrip()) and (indent_a == 0 or indent_b > 20):
                problem(f"`ubiquity {' '.join(path)} --help` breaks a sentence:\n      {a}\n      {b}")
    print(f"help: {count} commands checked at COLUMNS=1000")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    binary, root = sys.argv[1], sys.argv[2]
    check_readme_commands(binary, root)
    check_links(root)
    check_help_wrapping(binary)
    if problems:
        print(f"docs: {len(problems)} problem(s)")
        sys.exit(1)
    print("docs: all checks passed")


if __name__ == "__main__":
    main()
