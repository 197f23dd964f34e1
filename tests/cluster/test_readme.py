"""The README's shell examples run as written in bash and zsh: no unquoted `?`, `*`,
`[`, `]`, `(` or `)` (globs and subshells; zsh fails a command on a glob that
matches nothing), no `|` glued to a word (a pipe where an alternative was meant), and
every `amqlite` command line parses with the real click CLI. A cheap lint: it reads
the words as the shell would (quotes, backslashes, comments), it does not run them."""

from __future__ import annotations

import re

import click
import pytest

from cli.main import cli
from tests.cluster.test_compose import parse_amqlite
from tests.helpers.broker_proc import REPO_ROOT

README = REPO_ROOT / "README.md"
#: Characters the shell treats specially when unquoted and a README example never
#: means that way: globs (`?` `*` `[` `]`) and subshells (`(` `)`).
SPECIAL = set("?*[]()")
#: Command separators an example may use.
SEPARATORS = ("&&", "||", ";")


def shell_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, body) of every ```sh / ```bash / ```console block."""
    blocks = []
    for m in re.finditer(r"^```(?:sh|bash|shell|zsh)\s*\n(.*?)^```", text, re.M | re.S):
        blocks.append((text.count("\n", 0, m.start()) + 2, m.group(1)))
    return blocks


def scan(line: str) -> tuple[list[list[str]], list[str]]:
    """Split one logical command line like a POSIX shell (quotes, backslashes, `#`
    comments, separators): (the commands as lists of words, problems found)."""
    commands: list[list[str]] = [[]]
    problems: list[str] = []
    word: str | None = None
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if quote == "'":
            if ch == "'":
                quote = ""
            else:
                word = (word or "") + ch
        elif quote == '"':
            if ch == '"':
                quote = ""
            elif ch == "\\" and i + 1 < len(line) and line[i + 1] in '"\\$`':
                i += 1
                word = (word or "") + line[i]
            else:
                word = (word or "") + ch
        elif ch in "'\"":
            quote = ch
            word = word or ""
        elif ch == "\\" and i + 1 < len(line):
            i += 1
            word = (word or "") + line[i]
        elif ch.isspace():
            if word is not None:
                commands[-1].append(word)
                word = None
        elif ch == "#" and word is None:
            break  # a comment
        elif any(line.startswith(sep, i) for sep in SEPARATORS):
            sep = next(s for s in SEPARATORS if line.startswith(s, i))
            if word is not None:
                commands[-1].append(word)
                word = None
            commands.append([])
            i += len(sep)
            continue
        elif ch == "|":
            glued = (i > 0 and not line[i - 1].isspace()) or (
                i + 1 < len(line) and not line[i + 1].isspace())
            if glued:
                problems.append(f"unquoted '|' glued to a word at column {i + 1}")
            if word is not None:
                commands[-1].append(word)
                word = None
            commands.append([])
        elif ch in SPECIAL:
            problems.append(f"unquoted {ch!r} at column {i + 1}")
            word = (word or "") + ch
        else:
            word = (word or "") + ch
        i += 1
    if quote:
        problems.append("unterminated quote")
    if word is not None:
        commands[-1].append(word)
    return [c for c in commands if c], problems


def readme_commands() -> list[tuple[int, str]]:
    """(line number, logical line) of every command in the README's shell blocks,
    backslash-continued lines joined."""
    out = []
    for start, body in shell_blocks(README.read_text()):
        pending, first = "", start
        for n, raw in enumerate(body.splitlines(), start):
            if not pending:
                first = n
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            line = pending + raw
            pending = ""
            if line.strip():
                out.append((first, line))
    return out


def prompted_options(argv: list[str]) -> list[str]:
    """Values for the options the command would prompt for (`passwd`), so parsing it
    does not read the terminal."""
    command: click.Command = cli
    for word in argv[1:]:
        if not isinstance(command, click.Group):
            break
        sub = command.get_command(click.Context(command), word)
        if sub is None:
            break
        command = sub
    extra: list[str] = []
    for param in command.params:
        if isinstance(param, click.Option) and param.prompt and not set(param.opts) & set(argv):
            extra += [param.opts[0], "x"]
    return extra


def test_the_lint_catches_what_it_names() -> None:
    assert scan("amqlite consume --brokerUrl discovery:zk://h/a?group=g")[1]
    assert scan("amqlite cluster-list [--json]")[1]
    assert scan("amqlite produce --brokerUrl failover:(tcp://h:1)")[1]
    assert scan("amqlite queue purge|delete /queue/a")[1]
    words, problems = scan("amqlite consume --brokerUrl 'discovery:zk://h/a?group=g' "
                           "# any (comment) [here]?")
    assert not problems and words == [["amqlite", "consume", "--brokerUrl",
                                       "discovery:zk://h/a?group=g"]]
    words, problems = scan('pip install . && amqlite start --group "a b" ; ls | head')
    assert not problems
    assert words == [["pip", "install", "."], ["amqlite", "start", "--group", "a b"],
                     ["ls"], ["head"]]


def test_the_readme_has_shell_examples() -> None:
    commands = readme_commands()
    assert len(commands) >= 20
    assert any("container create" in line for _, line in commands)


@pytest.mark.parametrize(("line_no", "line"), readme_commands(),
                         ids=lambda v: str(v) if isinstance(v, int) else None)
def test_every_readme_example_is_quoted_for_bash_and_zsh(line_no: int, line: str) -> None:
    commands, problems = scan(line)
    assert not problems, f"README.md:{line_no}: {line.strip()}: {'; '.join(problems)}"
    for argv in commands:
        if argv[0] == "amqlite":
            parse_amqlite(argv + prompted_options(argv))


def test_container_and_failover_examples_agree_on_ports() -> None:
    """The `container create` example's ports are the ones the failover examples use."""
    commands = [argv for _, line in readme_commands() for argv in scan(line)[0]]
    (create,) = [a for a in commands if a[:3] == ["amqlite", "container", "create"]]
    names = create[3].split(",")
    base = int(create[create.index("--bind-base") + 1])
    ports = {base + i for i in range(len(names))}
    failover = [w for a in commands for w in a if w.startswith("failover:(")]
    assert failover
    for uri in failover:
        used = {int(p) for p in re.findall(r"tcp://127\.0\.0\.1:(\d+)", uri)}
        assert used <= ports, f"{uri} uses ports the containers do not have ({ports})"
    text = README.read_text()
    for uri in re.findall(r"failover:\(([^)]*)\)", text):
        used = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", uri)}
        assert used <= ports, f"README: failover:({uri}) does not match the containers"
