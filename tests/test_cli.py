import subprocess
import sys

from sip_bridge import __version__
from sip_bridge.cli import main


def test_version_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sip_bridge.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"sip-bridge {__version__}"


def test_run_says_what_exists(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["run"]) == 0
    printed = capsys.readouterr().out
    assert __version__ in printed
    assert "SIP leg not built yet" in printed
