"""The plugin's surface as users meet it: ``pytest --help``, the ini keys, the header, and a
plain run that has nothing to do with the plugin."""

from __future__ import annotations

from pytest_specdecode.settings import OPTIONS


def test_help_lists_every_option_with_its_default(pytester):
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0, result.stderr.str()
    lines = ["*performance-regression tests of speculative-decoding servers*"]
    lines += [f"*{option.flag}*" for option in OPTIONS]
    result.stdout.fnmatch_lines(lines, consecutive=False)
    result.stdout.fnmatch_lines(["*--specdecode-max-baseline-cv=CV*", "*default: 0.08*"])
    for option in OPTIONS:
        if option.ini:
            result.stdout.fnmatch_lines([f"*{option.ini_key} (string)*"])


def test_header_names_profiles_target_and_baselines(project):
    project.tests("def test_plain():\n    pass\n")
    result = project.run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["specdecode: profiles *specdecode.toml (ini key specdecode_config in *), target real*"]
    )


def test_a_run_without_specdecode_tests_touches_nothing(pytester, monkeypatch, tmp_path):
    """No profile file, no server, no state directory: the plugin stays out of the way."""
    state = tmp_path / "state"
    monkeypatch.setenv("PYTEST_SPECDECODE_STATE_DIR", str(state))
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("specdecode:*")  # no header, no server, no summary
    assert not state.exists()


def test_start_up_objects_are_frozen_and_a_tests_garbage_is_still_collected(pytester):
    """The plugin moves what pytest and it imported out of the collector's reach (shorter
    collections while a test measures, a cheaper exit); what a test makes is collected."""
    pytester.makepyfile(
        """
        import gc

        def test_frozen():
            assert gc.get_freeze_count() > 10_000  # pytest's and the plugin's modules
            gc.collect()
            cycle = []
            cycle.append(cycle)
            del cycle
            assert gc.collect() >= 1  # a test's garbage is not frozen
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
