"""The packages' layering, bottom to top: pdserve (protos/) < common < client < kv_transfer < engine < pod <
router | prefill_service | decode_service < bench | cli | autoscaler. No import runs upward; router and the two pod
roles import none of each other (bench, cli and autoscaler may import each other); no file-level import cycle
anywhere. The kernel tuners (engine/**/tune_*.py) and engine.tuning are imported only by each other and bench."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layering import LAYERS, Import, Project, import_cycles, layer_violations, module_name, scan, tracked_sources

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def project() -> Project:
    sources, generated = tracked_sources(REPO)
    return scan(REPO, sources, generated)


def test_every_source_belongs_to_a_layer(project: Project) -> None:
    packages = {name.partition(".")[0] for name in project.modules}
    assert packages == set().union(*LAYERS)


def test_no_import_runs_upward_or_sideways(project: Project) -> None:
    violations = layer_violations(project)
    assert violations == [], "imports against the layering:\n" + "\n".join(violations)


def test_no_file_level_import_cycle(project: Project) -> None:
    cycles = import_cycles(project)
    assert cycles == [], "file-level import cycles:\n" + "\n".join(cycles)


def _is_tuning(module: str) -> bool:
    """engine.tuning and the kernel tuners beside their tables (engine/**/tune_*.py)."""
    return module.startswith("engine.") and (
        module.split(".")[1] == "tuning" or module.rpartition(".")[2].startswith("tune_")
    )


def test_only_tuners_and_bench_import_the_tuning_code(project: Project) -> None:
    """The tuners (GPU timing, torch-heavy) run as `python -m`; what the engine serves with never imports them."""
    found = [
        imp.where()
        for imp in project.imports
        if _is_tuning(imp.target) and not (_is_tuning(module_name(imp.path)) or imp.path.startswith("bench/"))
    ]
    assert found == [], "tuning code imported outside the tuners and bench:\n" + "\n".join(found)


def test_module_name_maps_protos_and_packages() -> None:
    assert module_name("protos/pdserve/v1/__init__.py") == "pdserve.v1"
    assert module_name("engine/layers/kernels.py") == "engine.layers.kernels"
    assert module_name("engine/__init__.py") == "engine"


def _plant(root: Path, files: dict[str, str]) -> Project:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return scan(root, sorted(files), [])


PLANTED = {
    "common/__init__.py": "",
    "common/base.py": "import os\n\n\ndef late() -> None:\n    from engine.top import run\n",
    "engine/__init__.py": "from .top import run\n",
    "engine/top.py": "from . import helper\nimport common.base\n",
    "engine/helper.py": "from .top import run\n",
    "engine/layers/__init__.py": "from .. import helper\nfrom ..top import run\n",
    "prefill_service/__init__.py": "",
    "prefill_service/server.py": "import decode_service.server\n",
    "decode_service/__init__.py": "",
    "decode_service/server.py": "import common.base as base\n",
    "bench/__init__.py": "",
    "bench/run.py": "from cli import main\n",
    "cli/__init__.py": "",
    "cli/main.py": "from bench.run import x\n",
}


def test_scan_resolves_relative_and_nested_imports(tmp_path: Path) -> None:
    imports = [imp for imp in _plant(tmp_path, PLANTED).imports if imp.path.startswith("engine/")]
    assert imports == [
        Import("engine/__init__.py", 1, "from .top import run", "engine.top"),
        Import("engine/helper.py", 1, "from .top import run", "engine.top"),
        Import("engine/layers/__init__.py", 1, "from .. import helper", "engine.helper"),
        Import("engine/layers/__init__.py", 2, "from ..top import run", "engine.top"),
        Import("engine/top.py", 1, "from . import helper", "engine.helper"),
        Import("engine/top.py", 2, "import common.base", "common.base"),
    ]


def test_planted_upward_and_sideways_imports_are_found(tmp_path: Path) -> None:
    assert layer_violations(_plant(tmp_path, PLANTED)) == [
        "common/base.py:5: `from engine.top import run`: common may not import engine (upward)",
        "prefill_service/server.py:1: `import decode_service.server`: prefill_service may not import decode_service "
        "(sideways)",
    ]


def test_planted_cycles_are_found(tmp_path: Path) -> None:
    assert import_cycles(_plant(tmp_path, PLANTED)) == [
        "import cycle: bench/run.py:1: `from cli import main` -> cli/main.py:1: `from bench.run import x` -> "
        "bench/run.py",
        "import cycle: common/base.py:5: `from engine.top import run` -> engine/top.py:2: `import common.base` -> "
        "common/base.py (cycle group: common/base.py, engine/helper.py, engine/top.py)",
    ]


def test_clean_tree_has_no_findings(tmp_path: Path) -> None:
    clean = {"common/__init__.py": "", "engine/__init__.py": "from common import x\n", "cli/main.py": "import engine\n"}
    project = _plant(tmp_path, clean)
    assert (layer_violations(project), import_cycles(project)) == ([], [])
