"""The systemd unit for this installation: deploy/systemd/fleetd.service with its fields filled."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

TEMPLATE_NAME = "fleetd.service"
PLACEHOLDER = re.compile(r"@[A-Z_]+@")
# What useradd accepts on Debian and what systemd accepts in User= without complaint.
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# What ProtectHome= hides.
HOME_ROOTS = (PurePosixPath("/home"), PurePosixPath("/root"), PurePosixPath("/run/user"))
DEFAULT_STATE_DIR = PurePosixPath("/var/lib/fleetd")
# What PrivateTmp= replaces.
TMP_ROOTS = (PurePosixPath("/tmp"), PurePosixPath("/var/tmp"))


@dataclass(frozen=True)
class InstallPaths:
    """Where this installation lives, each path as written and as its real path."""

    read_only: tuple[Path, ...] = ()  # the venv, its real Python, the code, the config
    writable: tuple[Path, ...] = ()  # the config's state_dir, when it names one
    # Where else the config has the daemon write: a [backup] target directory, a [cluster] storage
    # mount. Mounted '-'-prefixed (ignored where missing at start): a backup disk not mounted
    # after a reboot fails the backups, not every start of the daemon (status=226/NAMESPACE).
    optional: tuple[Path, ...] = ()

    def all_writable(self) -> tuple[Path, ...]:
        return self.writable + self.optional

    def rw_arg(self, path: PurePosixPath) -> str:
        """A read-write entry: '-'-prefixed where only optional paths are under it."""
        required = any(p == path or path in p.parents for p in self.writable)
        return path_arg(path) if required else "-" + path_arg(path)

    def under_home(self) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
        """(read-only, read-write) paths that ProtectHome=yes would hide, fewest that cover them."""
        writable = covering(p for p in self.all_writable() if is_under_home(p))
        readable = covering(p for p in self.read_only if is_under_home(p) and not inside_any(p, writable))
        return readable, writable


    def under_tmp(self) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
        """(read-only, read-write) paths that PrivateTmp=yes would hide, fewest that cover them."""
        writable = covering(p for p in self.all_writable() if inside_any(p, TMP_ROOTS))
        readable = covering(p for p in self.read_only if inside_any(p, TMP_ROOTS) and not inside_any(p, writable))
        return readable, writable


def is_under_home(path: PurePosixPath) -> bool:
    return inside_any(path, HOME_ROOTS)


def inside_any(path: PurePosixPath, roots: Iterable[PurePosixPath]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def covering(paths: Iterable[Path]) -> tuple[Path, ...]:
    """Sorted, without duplicates and without paths inside another one of them."""
    unique = sorted(set(paths))
    return tuple(p for p in unique if not any(q != p and q in p.parents for q in unique))


def template_path() -> Path:
    package = Path(__file__).resolve().parents[1]  # fleetd/
    bundled = package / "_systemd" / TEMPLATE_NAME  # inside an installed wheel
    return bundled if bundled.is_file() else package.parent / "deploy" / "systemd" / TEMPLATE_NAME


def render_unit(fleetd_bin: str, config: str, user: str, paths: InstallPaths = InstallPaths()) -> str:
    """The unit text; ValueError names the argument a unit file cannot carry."""
    if not USER_NAME.fullmatch(user):
        raise ValueError(f"user {user!r} is not a valid system user name (lowercase letters, digits, '-', '_')")
    fields = {
        "@FLEETD_BIN@": exec_arg(fleetd_bin, "fleetd binary"),
        "@CONFIG@": exec_arg(config, "config"),
        "@USER@": user,
        "@PROTECT_HOME@": protect_home(paths),
        "@PRIVATE_TMP@": private_tmp(paths),
    }
    text = template_path().read_text()
    for placeholder, value in fields.items():
        text = text.replace(placeholder, value)
    left = PLACEHOLDER.findall(text)
    assert not left, f"the unit template has fields render_unit does not fill: {left}"
    return text


def protect_home(paths: InstallPaths) -> str:
    """ProtectHome=yes, or tmpfs with the installation's paths under a home mounted back."""
    readable, writable = paths.under_home()
    extra = writable_elsewhere(paths)
    if not readable and not writable:
        return "ProtectHome=yes" + extra
    # ProtectHome=yes would hide these: ExecStart= or the Python it names would not exist and
    # every start would fail with status=203/EXEC, for ever. read-only is not enough either
    # when a home is mode 0700 (/root always is): the service user cannot walk into it.
    homes = ", ".join(sorted({home_of(p) for p in readable + writable}))
    note = (
        f"This installation lives partly under {homes}, which ProtectHome=yes would hide: every start "
        "would fail with status=203/EXEC. tmpfs hides every home all the same and mounts back only the "
        "paths below, read-only except where fleetd writes (systemd before 257 leaves the tmpfs itself "
        "writable; it is private to the service and discarded). Found by `fleetd systemd-unit`: regenerate "
        "after moving the venv, its Python, the config, state_dir or a [backup] target; add a path it cannot "
        "know of (a [worker] python elsewhere) with BindReadOnlyPaths= in a drop-in."
    )
    lines = [
        *("# " + line for line in textwrap.wrap(note, 94)),
        "ProtectHome=tmpfs",
    ]
    lines += [f"BindReadOnlyPaths={path_arg(p)}" for p in readable]
    lines += [f"BindPaths={paths.rw_arg(p)}" for p in writable]
    return "\n".join(lines) + extra


def private_tmp(paths: InstallPaths) -> str:
    """PrivateTmp=yes, with an installation that lives under /tmp mounted back into it."""
    readable, writable = paths.under_tmp()
    if not readable and not writable:
        return "PrivateTmp=yes"
    hidden = covering(readable + writable)
    note = (
        f"This installation lives under a temporary directory ({', '.join(map(str, hidden))}), which "
        "PrivateTmp=yes replaces with an empty one: it is mounted back, read-only except where fleetd "
        "writes. /tmp may be emptied at boot, taking the installation with it: install under /opt or /srv "
        "and regenerate."
    )
    lines = [*("# " + line for line in textwrap.wrap(note, 94)), "PrivateTmp=yes"]
    lines += [f"BindReadOnlyPaths={path_arg(p)}" for p in readable]
    return "\n".join(lines + [f"BindPaths={paths.rw_arg(p)}" for p in writable])


def writable_elsewhere(paths: InstallPaths) -> str:
    # ProtectSystem=strict leaves only StateDirectory= writable; a state_dir, [backup] target or
    # [cluster] storage the config names elsewhere (and not under a home or /tmp, which BindPaths=
    # covers) must be opened up explicitly, or each write there fails: Read-only file system.
    elsewhere = [p for p in covering(paths.all_writable())
                 if not is_under_home(p) and not inside_any(p, [DEFAULT_STATE_DIR, *TMP_ROOTS])]
    if not elsewhere:
        return ""
    note = ("\n# Where the config has fleetd write (state_dir, [backup] target, [cluster] storage): create each,"
            "\n# owned by User=, before the first start ('-': one missing at start is left read-only, and"
            "\n# what writes there fails until it exists and the service is restarted).")
    return note + "".join(f"\nReadWritePaths={paths.rw_arg(p)}" for p in elsewhere)


def home_of(path: PurePosixPath) -> str:
    """The home a path is in: /home/alice for /home/alice/venv; /root; /run/user."""
    root = next(r for r in HOME_ROOTS if path == r or r in path.parents)
    if root == PurePosixPath("/home") and path != root:
        return str(root / path.relative_to(root).parts[0])
    return str(root)


def path_arg(path: PurePosixPath) -> str:
    """One BindPaths=/ReadWritePaths= entry; ':' would split source from destination."""
    value = str(path)
    if ":" in value:
        raise ValueError(f"the path {value!r} contains ':', which BindPaths= reads as source:destination; move it")
    return word(value, "install")


def exec_arg(value: str, what: str) -> str:
    """One ExecStart= word: an absolute path, with systemd's specifier and variable characters escaped."""
    if not value.startswith("/"):
        raise ValueError(f"the {what} path {value!r} must be absolute: systemd does not resolve relative paths")
    # '$' starts an environment variable in ExecStart= only.
    return word(value.replace("$", "$$"), what)


def word(value: str, what: str) -> str:
    if any(ch in value for ch in "\n\r\"\\"):
        raise ValueError(f"the {what} path {value!r} contains a newline, quote or backslash")
    # '%' starts a unit specifier in every setting that takes a path.
    escaped = value.replace("%", "%%")
    # systemd unquotes a word wherever a quote appears in it: a lone "'" (/srv/o'brien) is
    # "Unbalanced quoting" and the whole setting is ignored. Inside double quotes it is a letter.
    return f'"{escaped}"' if any(ch.isspace() or ch == "'" for ch in escaped) else escaped


HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
HEAD_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*:\d{1,5}")


def render_ray_node_unit(ray_bin: str, head: str, host: str, user: str, storage: str | None = None) -> str:
    """A GPU host's Ray worker node as a systemd unit (docs/cluster.md). The node offers the
    custom resource `fleetd_host_<host>`: fleetd names the host by it in `fleetd hosts`."""
    if not USER_NAME.fullmatch(user):
        raise ValueError(f"user {user!r} is not a valid system user name (lowercase letters, digits, '-', '_')")
    if not HEAD_ADDRESS.fullmatch(head):
        raise ValueError(f"--head {head!r} must be the Ray head's GCS address HOST:PORT (e.g. head.lan:6379)")
    if not HOST_NAME.fullmatch(host):
        raise ValueError(f"--host-name {host!r} must be letters, digits, '.', '_' or '-' (at most 63)")
    ray = exec_arg(ray_bin, "ray binary")
    # A URL storage is reached over the network, not mounted: nothing to wait for.
    mounts = f"RequiresMountsFor={path_arg(PurePosixPath(storage))}\n" if storage and "://" not in storage else ""
    return textwrap.dedent(f"""\
        # A Ray worker node for fleetd, rendered by `fleetd systemd-unit --ray-node`.
        # Install the same fleetd and ray versions as the head: fleetd refuses a node whose
        # versions differ (see docs/cluster.md).
        [Unit]
        Description=Ray worker node of the fleetd cluster (head {head})
        Wants=network-online.target
        After=network-online.target remote-fs.target
        {mounts}
        [Service]
        Type=simple
        User={user}
        Environment=RAY_USAGE_STATS_ENABLED=0
        ExecStart={ray} start --block --address={head} '--resources={{"fleetd_host_{host}": 1}}'
        # The node's raylet, its Ray workers and the training workers they started all go with it.
        KillMode=control-group
        TimeoutStopSec=90
        Restart=always
        RestartSec=10

        [Install]
        WantedBy=multi-user.target
        """)
