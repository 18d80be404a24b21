"""Run many ``train_mask`` command lines in one process (imports paid once), named
``train_mask`` as the installed script is (the command line names itself as invoked).

    python -m tests.reliability.cli_batch SPEC.json RESULTS.json

SPEC is ``{name: [argv...]}``. Each case runs ``datamask_pipeline.engine.cli.main(argv)`` with
its stdout/stderr captured; an exception escaping ``main`` is recorded with its traceback
(rc ``"exception"``): the command line must turn every bad input into exit code 2 and a
one-line reason, never a crash. RESULTS is ``{name: {rc, stdout, stderr, seconds}}``.
"""

import contextlib
import io
import json
import sys
import time
import traceback


def main(argv=None) -> int:
    spec_path, out_path = (argv or sys.argv[1:])[:2]
    with open(spec_path) as fh:
        spec = json.load(fh)
    from datamask_pipeline.engine import cli

    # the cases run as the installed ``train_mask`` script would: its messages name it
    sys.argv = ["train_mask", *sys.argv[1:]]
    results = {}
    for name, case_argv in spec.items():
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(list(case_argv))
            except SystemExit as exc:  # argparse errors
                rc = exc.code
            except BaseException:  # noqa: BLE001 - recorded, asserted by the tests
                rc = "exception"
                err.write(traceback.format_exc())
        results[name] = {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(),
                         "seconds": round(time.perf_counter() - t0, 3)}
    with open(out_path, "w") as fh:
        json.dump(results, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
