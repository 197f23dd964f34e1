"""The users file's authorization rules and the hash format, without a broker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from amqlite import auth
from amqlite.auth import AuthError, check_hash, hash_password, needs_upgrade, verify_password
from amqlite.authz import Permission, load_users_file, parse_pattern

HASH = hash_password("pw")


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "users.toml"
    path.write_text(f'[users]\nalice = "{HASH}"\nbob = "{HASH}"\n' + text)
    return str(path)


@pytest.mark.parametrize("pattern, name, ok", [
    ("/queue/a.b", "/queue/a.b", True),
    ("/queue/a.b", "/queue/a.b.c", False),
    ("/queue/a.*", "/queue/a.b", True),
    ("/queue/a.*", "/queue/a.b.c", False),
    ("/queue/a.*", "/queue/a", False),
    ("/queue/a.>", "/queue/a.b.c", True),
    ("/queue/a.>", "/queue/a", False),       # '>' is one or more segments, as ActiveMQ
    ("/queue/>", "/queue/anything.at.all", True),
    ("/queue/>", "/topic/x", False),
    ("/topic/*.news", "/topic/eu.news", True),
    ("/topic/*.news", "/topic/eu.sports", False),
])
def test_activemq_wildcards(tmp_path: Path, pattern: str, name: str, ok: bool) -> None:
    uf = load_users_file(write(tmp_path, f'[groups]\ng = ["alice"]\n[[authorization]]\n'
                                         f'destination = "{pattern}"\nread = ["g"]\n'))
    assert uf.policy.allowed("alice", name, Permission.READ) is ok
    assert not uf.policy.allowed("bob", name, Permission.READ)  # in no group
    assert not uf.policy.allowed("alice", name, Permission.WRITE)


@pytest.mark.parametrize("pattern", ["/queue/", "orders", "/queue/a..b", "/queue/a*",
                                     "/queue/>.a", "/queue/a.b>"])
def test_malformed_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(AuthError):
        parse_pattern(pattern, "here")


def test_matching_entries_are_united_and_no_entries_means_no_checks(tmp_path: Path) -> None:
    uf = load_users_file(write(tmp_path, '[groups]\na = ["alice"]\nb = ["bob"]\n'
                               '[[authorization]]\ndestination = "/queue/x.>"\nwrite = ["a"]\n'
                               '[[authorization]]\ndestination = "/queue/x.y"\nwrite = ["b"]\n'))
    assert uf.policy.allowed("alice", "/queue/x.y", Permission.WRITE)
    assert uf.policy.allowed("bob", "/queue/x.y", Permission.WRITE)
    assert not uf.policy.allowed("bob", "/queue/x.z", Permission.WRITE)
    assert not load_users_file(write(tmp_path, "")).policy.enabled


def test_unknown_group_and_unknown_key_are_refused(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="unknown group"):
        load_users_file(write(tmp_path, '[[authorization]]\ndestination = "/queue/x"\n'
                                        'read = ["ghosts"]\n'))
    with pytest.raises(AuthError, match="unknown key"):
        load_users_file(write(tmp_path, '[groups]\ng = []\n[[authorization]]\n'
                                        'destination = "/queue/x"\nreed = ["g"]\n'))


def test_a_bad_hash_is_refused_without_quoting_it(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text('[users]\nalice = "md5$deadbeefcafe"\n')
    with pytest.raises(AuthError) as e:
        load_users_file(str(path))
    assert "alice" in str(e.value) and "deadbeefcafe" not in str(e.value)


def test_old_parameters_still_verify_and_are_flagged_for_upgrade(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "SCRYPT_N", 2**12)
    old = hash_password("secret")
    monkeypatch.undo()
    assert old.startswith("scrypt$4096$")
    assert check_hash(old) is None
    assert verify_password("secret", old) and not verify_password("other", old)
    assert needs_upgrade(old) and not needs_upgrade(hash_password("secret"))
    assert not verify_password("secret", "bcrypt$whatever")


def test_empty_password_refused() -> None:
    for pw in ("", "   "):
        with pytest.raises(ValueError):
            auth.check_new_password(pw)


#: Names that hold a secret somewhere in the code base: none may reach a log call or an
#: exception message. (``ssl_key``/``key_file`` hold the private key's *path*, which an
#: error must name so the operator can fix it; the key itself is only read by ssl.)
SECRET_NAMES = {"passcode", "password", "stored", "digest", "users"}
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}


def _names(node: ast.AST) -> set[str]:
    """Names used in an expression, except inside len() (a count is no secret)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "len"):
        return set()
    found = {node.id} if isinstance(node, ast.Name) else (
        {node.attr} if isinstance(node, ast.Attribute) else set())
    for child in ast.iter_child_nodes(node):
        found |= _names(child)
    return found


def test_no_secret_variable_reaches_a_log_call_or_an_error() -> None:
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in [*root.glob("amqlite/**/*.py"), *root.glob("cli/*.py")]:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            args: list[ast.AST] = []
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LOG_METHODS
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in ("log", "logger", "logging")):
                args = [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                args = list(node.exc.args)
            for arg in args:
                leaked = _names(arg) & SECRET_NAMES
                if leaked:
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}: {leaked}")
    assert not offenders, offenders
