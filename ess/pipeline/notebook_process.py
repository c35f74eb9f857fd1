"""Execute one notebook with papermill, in a process of its own (the pipeline's child).

``python -m ess.pipeline.notebook_process SPEC.json`` reads ``{"input", "output", "cwd", "parameters", "kernel_name",
"cell_timeout_s", "error_path"}``, executes the notebook into ``output`` and exits 0; on failure it writes what went
wrong to ``error_path`` as JSON (``kind``: ``cell_error``, ``timeout``, ``dead_kernel`` or ``error``) and exits 1.

The pipeline runs each notebook in a child so that it can always stop it cleanly: on Ctrl-C or SIGTERM it sends
SIGTERM here, nbclient shuts the kernel down, and the pipeline marks the partial notebook as interrupted.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _execute(spec: dict) -> dict | None:
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    try:
        pm.execute_notebook(spec["input"], spec["output"], parameters=spec["parameters"],
                            kernel_name=spec["kernel_name"], progress_bar=False, cwd=spec["cwd"],
                            execution_timeout=spec["cell_timeout_s"])
    except PapermillExecutionError as exc:
        return {"kind": "cell_error", "cell_index": exc.cell_index, "exec_count": exc.exec_count,
                "ename": exc.ename, "evalue": exc.evalue}
    except CellTimeoutError as exc:
        preview = " | ".join(line for line in str(exc).splitlines()[4:7] if line.strip("-"))
        return {"kind": "timeout", "preview": preview}
    except DeadKernelError as exc:
        return {"kind": "dead_kernel", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which names the notebook
        return {"kind": "error", "message": f"{type(exc).__name__}: {exc}"}
    return None


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    error = _execute(spec)
    if error is None:
        return 0
    Path(spec["error_path"]).write_text(json.dumps(error), encoding="utf-8")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
