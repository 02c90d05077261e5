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
    # nor the garbage collector: frozen objects would be missing from gc.get_objects()
    pytester.makepyfile("import gc\n\ndef test_plain():\n    assert gc.get_freeze_count() == 0\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("specdecode:*")  # no header, no server, no summary
    assert not state.exists()


def test_a_session_of_the_plugins_tests_freezes_its_start_up_objects(project):
    """Once collection selected tests of the plugin, what pytest and the plugin imported is out
    of the collector's reach (shorter collections while a test measures, a cheaper exit); what
    a test makes is still collected."""
    project.tests(
        """
        import gc
        import pytest

        @pytest.mark.specdecode("nospec", workload="fast")
        def test_frozen():
            assert gc.get_freeze_count() > 10_000  # pytest's and the plugin's modules
            gc.collect()
            cycle = []
            cycle.append(cycle)
            del cycle
            assert gc.collect() >= 1  # a test's garbage is not frozen
        """
    )
    # recorded only so that the test runs; the noise guard is not what this is about
    recorded = project.run("--update-baselines", "--specdecode-max-baseline-cv", "10")
    recorded.assert_outcomes(passed=1)
