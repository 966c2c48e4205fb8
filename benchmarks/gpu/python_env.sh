# Sourced by the GPU scripts (from the repository root): the wheels carried in .whl installed
# once into /tmp/site (NO_WHEELS=1: already done by the caller), gputop from this checkout on
# PYTHONPATH, unbuffered output, and $py, the interpreter to run.
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
