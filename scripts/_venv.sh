# Sourced by scripts/test and scripts/demo: make sure "$VENV" holds a working Python 3.11+ venv.
# Environment: PYTHON (interpreter that creates the venv, default python3), VENV (default .venv).

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

ensure_venv() {
    local me="$1"
    if [[ ! -x "$VENV/bin/python" ]]; then
        if ! command -v "$PYTHON" >/dev/null 2>&1; then
            echo "$me: $PYTHON not found; install Python 3.11 or newer (or set PYTHON)" >&2
            exit 1
        fi
        if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            echo "$me: $("$PYTHON" --version 2>&1) is too old; Python 3.11 or newer is needed" \
                "(set PYTHON=python3.11 or newer)" >&2
            exit 1
        fi
        echo "$me: creating $VENV with $("$PYTHON" --version 2>&1)"
        if ! "$PYTHON" -m venv "$VENV"; then
            echo "$me: '$PYTHON -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
            rm -rf "$VENV"
            exit 1
        fi
    fi
    if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
        echo "$me: $VENV exists but its python does not run (moved or copied?); remove it" \
            "(rm -rf $VENV) and run $me again" >&2
        exit 1
    fi
}
