"""The A/B harness for library builds (`benchmarks.kernel_ab`): argument parsing, the libraries' alternation, the
medians and the table on the CPU with a stand-in for the child processes; the measurement itself on a GPU."""

import random
import statistics
import subprocess

import pytest
import torch

from benchmarks import kernel_ab


def test_libraries_parse_in_order_and_bad_specs_name_themselves():
    assert list(kernel_ab.parse_libraries(["new=/b.so", "base=/a.so"]).items()) == [("new", "/b.so"), ("base", "/a.so")]
    assert kernel_ab.parse_libraries(["x=/p/with=sign.so"]) == {"x": "/p/with=sign.so"}
    for bad in (["/a.so"], ["=/a.so"], ["base="]):
        with pytest.raises(ValueError, match="NAME=PATH"):
            kernel_ab.parse_libraries(bad)
    with pytest.raises(ValueError, match="'base' is given twice"):
        kernel_ab.parse_libraries(["base=/a.so", "base=/b.so"])


def test_arguments():
    args = kernel_ab.parse_args(["base=/a.so", "new=/b.so", "--pass", "bwd", "--cases", "small", "--rounds", "5"])
    assert (args.libraries, args.which, args.cases, args.rounds) == (
        {"base": "/a.so", "new": "/b.so"}, "bwd", "small", 5)
    defaults = kernel_ab.parse_args(["base=/a.so"])
    assert (defaults.which, defaults.cases, defaults.rounds, defaults.json) == ("fwd", "realistic", 3, None)
    assert kernel_ab.parse_args(["--child", "--pass", "bwd"]).child  # a child needs no libraries
    for bad in ([], ["base=/a.so", "--rounds", "0"], ["base=/a.so", "--pass", "both"], ["base=/a.so", "--cases", "x"],
                ["/a.so"]):
        with pytest.raises(SystemExit):
            kernel_ab.parse_args(bad)


def test_case_sets_name_real_layouts_and_shapes():
    from benchmarks import layouts

    for cases in kernel_ab.CASE_SETS.values():
        assert cases and len(set(cases)) == len(cases)
        for case in cases:
            assert case.mask in (*layouts.MASKS, "full", "decode") and case.heads_q % case.heads_kv == 0
            assert isinstance(getattr(torch, case.dtype), torch.dtype)
    assert kernel_ab.Case("vlm", 8192, 1, 32, 8, 128, "bfloat16").label == "vlm S8192 B1 H32/8 D128"


def fake_answers(libraries, rounds, cases, rng):
    """Every (library, round) answer a child could give: random times and sums."""
    return {(name, r): {"device": "GPU", "torch": "x", "library": path,
                        "rows": [{"case": f"case {i}", "kernel_us": rng.uniform(5, 5000), "tflops": rng.uniform(1, 700),
                                  "eager_us": rng.uniform(5, 5000), "sums": [rng.uniform(1, 1e6) for _ in range(3)]}
                                 for i in range(cases)]}
            for name, path in libraries.items() for r in range(rounds)}


def test_alternate_takes_turns_within_each_round(capsys):
    libraries = {"base": "/a.so", "new": "/b.so", "third": "/c.so"}
    answers = fake_answers(libraries, 4, 2, random.Random(0))
    calls = []

    def run(path):
        name = next(n for n, p in libraries.items() if p == path)
        calls.append(name)
        return answers[name, sum(c == name for c in calls) - 1]

    runs = kernel_ab.alternate(libraries, 4, run)
    assert calls == ["base", "new", "third"] * 4
    assert runs == {name: [answers[name, r] for r in range(4)] for name in libraries}
    progress = capsys.readouterr().err.splitlines()
    assert len(progress) == 12 and progress[0].startswith("[1/4] base: ") and progress[-1].startswith("[4/4] third: ")


def test_summary_takes_medians_speeds_and_sum_differences_against_the_first_library():
    rng = random.Random(1)
    libraries = {"base": "/a.so", "new": "/b.so"}
    rounds, cases = 5, 3
    answers = fake_answers(libraries, rounds, cases, rng)
    runs = {name: [answers[name, r] for r in range(rounds)] for name in libraries}
    summary = kernel_ab.summarise(runs)
    assert [entry["case"] for entry in summary] == [f"case {i}" for i in range(cases)]
    for i, entry in enumerate(summary):
        base_kernel = sorted(runs["base"][r]["rows"][i]["kernel_us"] for r in range(rounds))[rounds // 2]
        for name in libraries:
            rows = [runs[name][r]["rows"][i] for r in range(rounds)]
            got = entry["libraries"][name]
            for key in ("kernel_us", "tflops", "eager_us"):
                assert got[key] == sorted(row[key] for row in rows)[rounds // 2]  # odd count: the middle one
            assert got["speed"] == pytest.approx(base_kernel / got["kernel_us"])
            reference = runs["base"][0]["rows"][i]["sums"]
            worst = max(abs(a - b) / b for row in rows for a, b in zip(row["sums"], reference))
            assert got["sum_diff"] == pytest.approx(worst)
        assert entry["libraries"]["base"]["speed"] == 1.0


def test_summary_median_of_an_even_count_is_the_mean_of_the_middle_two():
    answers = fake_answers({"base": "/a.so"}, 4, 1, random.Random(2))
    runs = {"base": [answers["base", r] for r in range(4)]}
    times = sorted(answers["base", r]["rows"][0]["kernel_us"] for r in range(4))
    assert kernel_ab.summarise(runs)[0]["libraries"]["base"]["kernel_us"] == pytest.approx((times[1] + times[2]) / 2)


def test_table_has_a_row_per_case_and_the_others_compared_with_the_first():
    answers = fake_answers({"base": "/a.so", "new": "/b.so"}, 3, 2, random.Random(3))
    runs = {name: [answers[name, r] for r in range(3)] for name in ("base", "new")}
    summary = kernel_ab.summarise(runs)
    lines = kernel_ab.table(summary).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["case", "base kernel us", "base TFLOP/s", "base eager us", "new kernel us", "new TFLOP/s",
                      "new eager us", "new speed", "new sum diff"]
    assert len(lines) == 2 + 2
    for i, line in enumerate(lines[2:]):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows = {name: [runs[name][r]["rows"][i] for r in range(3)] for name in ("base", "new")}
        kernel = {name: statistics.median(row["kernel_us"] for row in rows[name]) for name in rows}
        assert cells[0] == f"case {i}"
        assert float(cells[1]) == pytest.approx(kernel["base"], abs=0.05)
        assert float(cells[4]) == pytest.approx(kernel["new"], abs=0.05)
        assert float(cells[7]) == pytest.approx(kernel["base"] / kernel["new"], abs=5e-4)


def test_main_prints_the_table_from_the_children(monkeypatch, capsys, tmp_path):
    libraries = {"base": "/a.so", "new": "/b.so"}
    answers = fake_answers(libraries, 2, len(kernel_ab.CASE_SETS["realistic"]), random.Random(4))
    seen_args, counts = [], {}

    def fake_child_process(child_args, trees):
        seen_args.append(child_args)
        assert trees == {}

        def run(path):
            name = next(n for n, p in libraries.items() if p == path)
            counts[name] = counts.get(name, 0) + 1
            return answers[name, counts[name] - 1]

        return run

    monkeypatch.setattr(kernel_ab, "child_process", fake_child_process)
    out_json = tmp_path / "ab.json"
    kernel_ab.main(["base=/a.so", "new=/b.so", "--pass", "bwd", "--rounds", "2", "--json", str(out_json)])
    assert seen_args == [["--pass", "bwd", "--cases", "realistic"]]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("GPU, torch x; pass bwd, cases realistic, median of 2 rounds")
    assert len(printed) == 1 + 2 + len(kernel_ab.CASE_SETS["realistic"])
    import json

    saved = json.loads(out_json.read_text())
    assert saved["libraries"] == libraries and len(saved["runs"]["new"]) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["fwd", "bwd"])
def test_measure_case_on_the_gpu(which):
    row = kernel_ab.measure_case(kernel_ab.Case("vlm", 1024, 1, 4, 2, 64, "bfloat16"), which)
    assert row["case"] == "vlm S1024 B1 H4/2 D64"
    assert row["kernel_us"] > 0 and row["eager_us"] > 0 and row["tflops"] > 0
    assert len(row["sums"]) == (1 if which == "fwd" else 3) and all(s > 0 for s in row["sums"])


def test_a_tree_runs_its_librarys_children_from_that_tree(tmp_path, monkeypatch):
    """``--tree base=DIR``: base's children run from DIR with DIR first on the path (its own Python side, for a
    library of another ABI); the other library's from this repository."""
    tree = tmp_path / "old"
    (tree / "benchmarks").mkdir(parents=True)
    (tree / "benchmarks" / "kernel_ab.py").write_text("")
    args = kernel_ab.parse_args(["base=/a.so", "new=/b.so", "--tree", f"base={tree}"])
    assert args.trees == {"/a.so": str(tree.resolve())}
    calls = []

    def fake_run(command, env, cwd, **kwargs):
        calls.append((cwd, env["PYTHONPATH"], env["OMNI_HF_CUDA_LIB"]))
        return subprocess.CompletedProcess(command, 0, stdout='{"rows": []}\n', stderr="")

    monkeypatch.setattr(kernel_ab.subprocess, "run", fake_run)
    run = kernel_ab.child_process(["--pass", "fwd"], args.trees)
    assert run("/a.so") == {"rows": []} and run("/b.so") == {"rows": []}
    repo = str(kernel_ab.REPO_ROOT)
    assert calls == [(str(tree.resolve()), str(tree.resolve()), "/a.so"), (repo, repo, "/b.so")]


@pytest.mark.parametrize("spec, message", [("other=/x", "NAME one of base"), ("base", "NAME one of base"),
                                           ("base=/nowhere", "holding benchmarks/kernel_ab.py")])
def test_a_bad_tree_is_refused(spec, message, capsys):
    with pytest.raises(SystemExit):
        kernel_ab.parse_args(["base=/a.so", "--tree", spec])
    assert message in capsys.readouterr().err

