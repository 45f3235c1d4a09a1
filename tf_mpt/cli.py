"""Command line: `tf-mpt run script.py [args...]` and `python -m tf_mpt script.py [args...]`;
`tf-mpt convert`, `tf-mpt inspect` (models), `tf-mpt measure` (a cost table of this machine,
for `--target FILE` elsewhere) and `tf-mpt cpu` (this machine's half-precision facts).

Both run the script as __main__ with tf_mpt enabled, as TF_MPT_ENABLE=1 would (the other
TF_MPT_* variables still apply; an explicitly set sub-switch still wins).
"""

import argparse
import contextlib
import dataclasses
import json
import os
import runpy
import subprocess
import sys

USAGE = "python -m tf_mpt script.py [args...]"


def _run(script, args):
    from tf_mpt._process import startup as _startup  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(script):
        sys.stderr.write(f"tf_mpt: no such script: {script!r}. Usage: {USAGE}\n")
        raise SystemExit(2)
    os.environ["TF_MPT_ENABLE"] = "1"  # sub-switches set by the user still win
    _startup.install_from_env(at_startup=False)
    sys.argv = [script] + list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def run_script_main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(f"usage: {USAGE}\n")
        raise SystemExit(0 if argv else 2)
    _run(argv[0], argv[1:])


def _cpu_command():
    from tf_mpt import _cpu  # pylint: disable=g-import-not-at-top
    config = _environment_config("cpu")
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tf_mpt import targets as _targets  # pylint: disable=g-import-not-at-top
    from tf_mpt.costs import dispatch as _dispatch  # pylint: disable=g-import-not-at-top
    gpu_visible = bool(tf.config.list_physical_devices("GPU"))
    print("\n".join(_cpu.facts(config, gpu_visible)))
    print("TensorFlow's oneDNN kernels: " + ("on" if _dispatch.onednn_on() else "off") +
          " in this process (TF_ENABLE_ONEDNN_OPTS)")
    requested = config.target if config.target in _targets.NAMES else "FILE"
    for dtype in ("bfloat16", "float16"):
        target = _targets.resolve(config, dtype, gpu_visible)
        why = f" ({target.why})" if target.why else ""
        print(f"target for {dtype} (TF_MPT_TARGET={requested}): {target.label}{why}")
    # what the dispatch and numerics checks found here (where a graph runs on this CPU)
    for dtype in ("bfloat16", "float16"):
        print("\n".join(_dispatch.described(config, dtype)))


def _environment_config(command):
    """The environment's Config; a bad TF_MPT_* value ends the command (bad input, 4)."""
    from tf_mpt import config as _config  # pylint: disable=g-import-not-at-top
    try:
        return _config.Config.from_env(os.environ)
    except ValueError as error:
        sys.stderr.write(f"tf-mpt {command}: {error}\n")
        raise SystemExit(EXIT_BAD_INPUT) from None


def _cache_command(options):
    """What tf_mpt's cache directory holds, by kind; --clear removes tf_mpt's files."""
    from tf_mpt._process import cache_files  # pylint: disable=g-import-not-at-top
    directory = _environment_config("cache").cache_directory
    if options.clear:
        removed, left = cache_files.clear(directory)
        print(f"removed {len(removed)} file(s) from {directory}" +
              (f"; left {len(left)} that are not tf_mpt's: {', '.join(left)}" if left else ""))
        return
    print("\n".join(cache_files.lines(directory)))


def _doctor_command():
    """Whether `TF_MPT_ENABLE=1 python script.py` works in this environment and what it
    would do: the versions, the start-up hook, the settings set, the half type and target
    picked here, the cache."""
    import platform  # pylint: disable=g-import-not-at-top
    from tf_mpt import _cpu  # pylint: disable=g-import-not-at-top
    from tf_mpt._process import cache_files  # pylint: disable=g-import-not-at-top
    from tf_mpt._process import hook_check  # pylint: disable=g-import-not-at-top
    print(f"{_version()}; Python {platform.python_version()} on {platform.system()} "
          f"{platform.machine()}")
    hook = hook_check.hook_path()
    print("start-up hook: " + (
        f"installed ({hook}): TF_MPT_ENABLE=1 python script.py runs the script with tf_mpt"
        if hook else
        f"not installed (no {hook_check.PTH} in {', '.join(hook_check.site_directories())}; "
        "an editable install, pip install -e, has none): TF_MPT_ENABLE=1 python script.py "
        "converts nothing here. Install with `pip install .`, or run scripts with `tf-mpt "
        "run script.py`"))
    config = _environment_config("doctor")
    set_here = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("TF_MPT_"))
    print("TF_MPT_* set here: " + (", ".join(set_here) if set_here else "none (the defaults)"))
    try:
        import tensorflow as tf  # pylint: disable=g-import-not-at-top
        gpu_visible = bool(tf.config.list_physical_devices("GPU"))
    except Exception as error:  # pylint: disable=broad-except
        print(f"TensorFlow: cannot be imported ({type(error).__name__}: {error}); install "
              "tensorflow-cpu==2.21.* (or tensorflow[and-cuda]==2.21.* for a GPU)")
        return
    from tf_mpt import targets as _targets  # pylint: disable=g-import-not-at-top
    dtype = config.dtype if config.dtype != "auto" else _cpu.auto_dtype(
        gpu_visible, _cpu.cpu_flags(config))
    if dtype is None:
        print("TF_MPT_ENABLE=1 here: the script stays float32 (TF_MPT_DTYPE=auto: no GPU and "
              "no native bfloat16 on this CPU; half would be slower). `tf-mpt cpu` says why")
    else:
        target = _targets.resolve(config, dtype, gpu_visible)
        why = f" ({target.why})" if target.why else ""
        scaled = dataclasses.replace(config, enable=True).loss_scaling_for(dtype)
        print(f"TF_MPT_ENABLE=1 here: {dtype} (TF_MPT_DTYPE={config.dtype}), decisions for "
              f"target {target.label}{why}; loss scaling {'on' if scaled else 'off'}")
    print(cache_files.lines(config.cache_directory)[0] + " (`tf-mpt cache` lists it)")


def _measure_command(options):
    """Times the probe ops on this CPU in float32 and each half type (and, with --model, every
    matrix product and convolution of that model at its shapes); writes the cost table that
    `--target FILE` / TF_MPT_TARGET=FILE read on any machine."""
    environment = _environment_config("measure")  # (a bad setting stops it before measuring)
    from tf_mpt.models import sources as _sources  # pylint: disable=g-import-not-at-top
    from tf_mpt.costs import op_costs as _op_costs  # pylint: disable=g-import-not-at-top
    from tf_mpt.costs import probes as _probes  # pylint: disable=g-import-not-at-top
    from tf_mpt.choose import cache as _verdicts  # pylint: disable=g-import-not-at-top
    from tf_mpt.costs import dispatch as _dispatch  # pylint: disable=g-import-not-at-top
    from tf_mpt import rewrite  # pylint: disable=g-import-not-at-top
    dtypes = ("bfloat16", "float16") if options.dtype == "both" else (options.dtype,)
    model = _sources.open_model(options.model) if options.model else None

    def write(tables):
        try:
            with open(options.out, "w") as f:
                json.dump([tables[d] for d in dtypes], f, indent=1, sort_keys=True)
                f.write("\n")
        except OSError as error:
            sys.stderr.write(f"tf-mpt measure: cannot write {options.out!r} ({error}); pass a "
                             "writable path with --out.\n")
            raise SystemExit(EXIT_USAGE) from None

    tables = {}
    for dtype in dtypes:
        sys.stderr.write(f"tf-mpt measure: timing float32 and {dtype} kernels on this CPU ...\n")
        tables[dtype] = json.loads(_probes.measure(dtype).to_json())
        # how TensorFlow runs each half op type here, fusions included, for speed and
        # accuracy (the dispatch and numerics checks of a graph that runs where this table
        # stands in for the CPU)
        try:
            measured = _dispatch._in_child(  # pylint: disable=protected-access
                dtype, sorted(_dispatch.CHECKED_OPS))
            found = _dispatch.Ratios.from_json(measured)
            tables[dtype]["dispatch"] = dict(found.dispatch)
            tables[dtype]["numerics"] = dict(found.numerics)
        except (OSError, ValueError, subprocess.SubprocessError) as error:
            sys.stderr.write(f"tf-mpt measure: the dispatch check of {dtype} failed ({error}); "
                             "the table has no 'dispatch' or 'numerics' entry\n")
    write(tables)
    nodes, timed = 0, None
    for dtype in dtypes if model is not None else ():
        # the shapes the model's conversion asks times for, decided with the table just written
        config = rewrite.with_target(environment, options.out)
        with _op_costs.recording_node_specs() as specs:
            model.convert(dtype, config.lists_for(dtype), config=config)
        sys.stderr.write(f"tf-mpt measure: timing {len(specs)} matrix product / convolution "
                         f"shape(s) of {options.model} in float32 and {dtype} ...\n")
        tables[dtype]["nodes"] = _probes.time_nodes(sorted(specs), dtype)
        nodes += len(tables[dtype]["nodes"])
        write(tables)
        # then the model's graphs themselves, each candidate colouring decided with the
        # table as it now is, timed here (graph timing); the verdicts go into the table
        if config.timing_budget > 0:
            sys.stderr.write(f"tf-mpt measure: timing the candidate colourings of "
                             f"{options.model}'s graphs in {dtype} ...\n")
            with _verdicts.recording() as verdicts:
                conversion = model.convert(dtype, config.lists_for(dtype), config=config)
            for label, report in conversion.reports.items():
                if report.verdict is not None:
                    sys.stderr.write(f"tf-mpt measure: {label}: {report.verdict.describe()}\n")
            tables[dtype]["verdicts"] = verdicts
            timed = (timed or 0) + len(verdicts)
            write(tables)
    verdicts = f" and {timed} graph verdict(s)" if timed is not None else ""
    of_model = (f" and {nodes} node shape(s){verdicts} of {options.model}"
                if model is not None else "")
    print(f"wrote {options.out}: {', '.join(dtypes)} costs{of_model} "
          f"{tables[dtypes[0]]['source']}; use it with --target {options.out} "
          f"(TF_MPT_TARGET={options.out}) on any machine")


def _config_of(options):
    """The Config every rewrite of the command decides by: the environment's, with --target
    when given (TF_MPT_COST_MODEL, the target's older name, then set aside), so the decisions
    shown and written are the same ones. Prints the target and, for auto, why. The
    environment itself is left as it is."""
    from tf_mpt import config as _config  # pylint: disable=g-import-not-at-top
    from tf_mpt import rewrite  # pylint: disable=g-import-not-at-top
    from tf_mpt.models import model_io as _model_io  # pylint: disable=g-import-not-at-top
    try:
        config = _config.Config.from_env(os.environ)
        if options.target is not None:
            config = dataclasses.replace(rewrite.with_target(config, options.target),
                                         cost_model="auto")
        if getattr(options, "no_timing", False):
            config = dataclasses.replace(config, timing_budget=0.0)
        if options.dtype == "float32":  # back to float32: nothing to decide
            return config
        target = rewrite.target_for(config, options.dtype)
    except ValueError as error:
        raise _model_io.ModelError(str(error)) from None
    why = f" ({target.why})" if target.why else ""
    if not getattr(options, "json", False):  # --json: each report holds its target
        print(f"target: {target.label}{why}")
    return config


def _split(text):
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _lists(options):
    lists = options.config.lists_for(options.dtype)
    deny = _split(options.deny)
    return lists.edited(add={"deny": deny}) if deny else lists


def _tolerance(options):
    from tf_mpt.models import validation as _validation  # pylint: disable=g-import-not-at-top
    return _validation.Tolerance.for_dtype(options.dtype, options.rtol, options.atol)


def _convert_command(options):
    """Converts options.src into options.dst; returns what --json prints: {"reports": {label:
    the report as a dict, its verdict included}, "wrote": the destination, "validation":
    {"samples", "passed"} where validated}."""
    from tf_mpt.models import sources as _sources  # pylint: disable=g-import-not-at-top
    from tf_mpt.models import validation as _validation  # pylint: disable=g-import-not-at-top
    from tf_mpt.models import model_io as _model_io  # pylint: disable=g-import-not-at-top
    if options.auto_deny and not (options.validate or options.inputs):
        raise _model_io.UsageError("--auto-deny needs sample inputs to validate with: pass "
                                   "--validate (random inputs) or --inputs file.npz.")
    model = _sources.open_model(options.src)
    _model_io.check_destination(options.dst)
    if options.dtype == "float32" or (model.is_converted() and not options.force):
        # a converted model goes back to float32 (and from there to the --dtype asked for)
        model = model.in_float32()
        print(f"{options.src}: tf_mpt's conversion undone: every half op back in float32, "
              "its Casts removed")
        if options.dtype == "float32":
            model.write(model.as_conversion(), options.dst)
            print(f"wrote {options.dst}")
            return {"reports": {}, "wrote": options.dst}
    lists = _lists(options)
    keep = _split(options.keep_fp32)
    if options.keep_io_types:
        conversion = model.convert(options.dtype, lists, keep, config=options.config)
    elif isinstance(model, _sources.FrozenGraph):
        conversion = model.convert(options.dtype, lists, keep, keep_io_types=False,
                                   config=options.config)
    else:
        raise _model_io.UsageError(
            "--no-keep-io-types works on frozen graphs only: a SavedModel's signatures keep "
            "their input and output dtypes (callers and serving configs rely on them).")
    for label, report in conversion.reports.items():
        print(f"{label}: {report.summary()}")
    feeds = None  # sample inputs, drawn once for every validation below
    if options.validate or options.inputs:
        feeds = _validation.sample_feeds(model.input_specs(), options.samples,
                                         seed=options.seed, inputs_file=options.inputs)
        conversion = _validate_and_fix(model, conversion, lists, keep, feeds, options)
    if options.variables == "half":
        conversion = _store_variables_in_half(model, conversion, feeds, options)
    model.write(conversion, options.dst)
    print(f"wrote {options.dst}")
    found = {"reports": {label: report.to_dict() for label, report in
                         conversion.reports.items()}, "wrote": options.dst}
    if feeds is not None:  # (a validation that failed raised: nothing is written)
        found["validation"] = {"samples": len(feeds), "passed": True}
    return found


def _validation_errors(model, conversion, feeds, options):
    """[OutputError] of the conversion on `feeds`, printed as a table."""
    from tf_mpt.models import validation as _validation  # pylint: disable=g-import-not-at-top
    tolerance = _tolerance(options)
    errors = _validation.validate(model, conversion, feeds, tolerance)
    print(_validation.error_table(errors, tolerance))
    return errors


def _store_variables_in_half(model, conversion, feeds, options):
    """Variables only half ops read stored in half; validated again on `feeds` when given (the
    numbers are the same: each read cast the same float32 value to half before)."""
    from tf_mpt.models import sources as _sources  # pylint: disable=g-import-not-at-top
    if isinstance(model, _sources.FrozenGraph):
        print("--variables half: a frozen graph has no variables; its float32 constants that "
              "only half ops read are already stored in half.")
        return conversion
    conversion = model.store_variables_in_half(conversion, options.dtype)
    print("\n".join(conversion.variables.lines()))
    if feeds is not None:
        tolerance = _tolerance(options)
        errors = _validation_errors(model, conversion, feeds, options)
        if not all(e.ok(tolerance) for e in errors):
            from tf_mpt.models import model_io as _model_io  # pylint: disable=g-import-not-at-top
            raise _model_io.ValidationFailed("validation failed with the variables stored in "
                                             "half; "
                                       "nothing was written. Keep them float32 (--variables "
                                       "float32, the default).")
    return conversion


def _validate_and_fix(model, conversion, lists, keep, feeds, options):
    from tf_mpt.models import auto_deny as _auto_deny  # pylint: disable=g-import-not-at-top
    from tf_mpt.models import model_io as _model_io  # pylint: disable=g-import-not-at-top
    tolerance = _tolerance(options)
    errors = _validation_errors(model, conversion, feeds, options)
    if all(e.ok(tolerance) for e in errors):
        print(f"validation passed on {len(feeds)} sample(s)")
        return conversion
    failing = ", ".join(e.output for e in errors if not e.ok(tolerance))
    reasons = "; ".join(f"{e.output}: {', '.join(e.failures(tolerance))}" for e in errors
                        if not e.ok(tolerance))
    if not options.auto_deny:
        raise _model_io.ValidationFailed(
            f"validation failed: {failing} differ(s) from float32 ({reasons}). Nothing was "
            "written. Keep ops in float32 with --deny/--keep-fp32, let --auto-deny find them, "
            "or set the elementwise bound with --rtol/--atol.")
    if not options.keep_io_types:
        raise _model_io.UsageError("--auto-deny works with inputs and outputs keeping their "
                                   "dtypes (the default): drop --no-keep-io-types.")
    print(f"validation failed ({failing}); searching for the nodes to keep in float32 ...")
    found = _auto_deny.auto_deny(model, options.dtype, lists, keep, feeds, tolerance,
                                 blame_first=not options.bisect, config=options.config)
    conversion, kept = found.conversion, found.kept
    ops = {(d.function, d.name): d.op for report in conversion.reports.values()
           for d in report.decisions.values()}
    how = ("one-pass blame, validated once" if found.method == "blame" else
           "bisection" + (" (one-pass blame's nodes did not pass)" if found.blamed else ""))
    print(f"--auto-deny found them by {how}: {found.trials} trial(s), {found.seconds:.1f} s")
    print(f"--auto-deny kept {len(kept)} node(s) in float32:")
    for function, name in kept:
        where = f"{function}/" if function else ""
        print(f"  {where}{name} ({ops.get((function, name), '?')})")
    if found.blamed:
        print("\n".join(_blame_lines(found.blamed, options.dtype)))
    for label, report in conversion.reports.items():
        print(f"{label}: {report.summary()}")
    _validation_errors(model, conversion, feeds, options)
    return conversion


def _blame_lines(blamed, dtype):
    """Lines: each blamed node, its error, its inputs' and (when known) its error once kept
    float32."""
    from tf_mpt.models import blame as _blame  # pylint: disable=g-import-not-at-top
    lines = [f"one-pass blame: {len(blamed)} node(s) whose own {dtype} error jumps (relative "
             f"L2 > {_blame.FLOOR[dtype]:g} and > {_blame.JUMP:g}x their inputs')"]
    for error, after in blamed:
        kept = "" if after is None else f" -> {after:.3g} kept float32"
        lines.append(f"  {error.name} ({error.op}): error {error.error:.3g} (inputs "
                     f"{error.input_error:.3g}){kept}")
    return lines


def _inspect_command(options):
    from tf_mpt.models import sources as _sources  # pylint: disable=g-import-not-at-top
    from tf_mpt.models import validation as _validation  # pylint: disable=g-import-not-at-top
    from tf_mpt.models import inspection as _inspect  # pylint: disable=g-import-not-at-top
    if options.blame and not options.numerics:
        from tf_mpt.models import model_io as _model_io  # pylint: disable=g-import-not-at-top
        raise _model_io.UsageError("--blame runs on --numerics' samples: pass --numerics "
                                   "--blame.")
    model = _sources.open_model(options.src)
    lists = _lists(options)
    conversion = model.convert(options.dtype, lists, config=options.config)
    # the share of the model `convert` would write: its own frozen graph, same decisions
    written = model.frozen(conversion)
    shares = {label: _inspect.flop_share(graph_def, options.dtype)
              for label, (graph_def, _) in written.items()}
    variables = None  # what `convert --variables half` would store in half
    if isinstance(model, _sources.SavedModelDir) and len(model.proto.meta_graphs) == 1:
        variables = model.store_variables_in_half(conversion, options.dtype).variables
    data = None
    if options.json:  # (main prints it)
        data = {label: report.to_dict() for label, report in conversion.reports.items()}
        data["half_flop_share"] = {label: share for label, (share, _) in shares.items()}
        if variables is not None:
            data["variables_half_with_convert_variables"] = {
                "converted": sorted(variables.converted.values()), "kept_float32": variables.kept}
    else:
        for label, report in conversion.reports.items():
            print(f"== {label}: {report.summary()}")
            print("\n".join(_inspect.op_table(report)))
        for label, (share, unknown) in shares.items():
            text = "no MatMul/Conv2D FLOPs" if share is None else f"{share:.1%}"
            extra = f" ({unknown} op(s) with unknown shapes not counted)" if unknown else ""
            print(f"half-precision share of MatMul/Conv FLOPs in {label}: {text}{extra}")
        if variables is not None:
            print("with convert --variables half:")
            print("\n".join(variables.lines()))
    if options.tensorboard:
        graphs = {label: _inspect.annotated(graph_def, conversion.reports[label])
                  for label, graph_def in model.graph_defs(conversion).items()}
        _inspect.write_tensorboard(options.tensorboard, graphs)
        print(f"wrote the converted graph(s) to {options.tensorboard}: tensorboard --logdir "
              f"{options.tensorboard} (each node's attrs {_inspect.COLOUR_ATTR} and "
              f"{_inspect.REASON_ATTR})")
    if options.numerics:
        specs = model.input_specs()
        feeds = _validation.sample_feeds(specs, options.samples, seed=options.seed,
                                      inputs_file=options.inputs)
        for label, (graph_def, placeholders) in model.frozen().items():
            # which tensors run in half: those of the model `convert` writes
            converted = _inspect.half_node_names(written[label][0], options.dtype)
            label_feeds = [{placeholders[k]: v for k, v in sample[label].items()}
                           for sample in feeds]
            ranges, skipped = _inspect.numerics(graph_def, label_feeds, options.dtype,
                                                converted)
            print(f"== numerics of {label}")
            print("\n".join(_inspect.numerics_lines(ranges, skipped, options.dtype,
                                                     len(feeds))))
        if options.blame:
            from tf_mpt.models import blame as _blame  # pylint: disable=g-import-not-at-top
            found = _blame.find(model, conversion, options.dtype, feeds)
            if found:
                print("\n".join(_blame_lines([(error, None) for error, _ in found],
                                              options.dtype)))
                print("keep them float32: tf-mpt convert ... --keep-fp32 " + ",".join(
                    name if function is None else f"{function}/{name}"
                    for _, keys in found for function, name in keys))
            else:
                print(f"one-pass blame: no node's own {options.dtype} error jumps (relative "
                      f"L2 > {_blame.FLOOR[options.dtype]:g} and > {_blame.JUMP:g}x its "
                      "inputs') on these samples")
    return data


# tf-mpt's exit codes (docs/cli.md's table is made from these: exit_code_table)
EXIT_OK = 0
EXIT_VALIDATION_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_BAD_INPUT = 4
EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_VALIDATION_FAILED: "validation failed: the converted model's outputs differ from "
    "float32's beyond the check (`--validate`; with `--auto-deny`: no conversion found that "
    "passes); nothing was written",
    EXIT_USAGE: "usage: the command line cannot be done as asked (an unknown or missing "
    "option, options that do not go together or do not apply to this kind of model, a node "
    "the model does not have, a destination that exists)",
    EXIT_INTERNAL: "internal error: the rewrite failed inside tf_mpt; nothing was written "
    "(please report it with the model)",
    EXIT_BAD_INPUT: "bad input: the model, the sample inputs, a target table or a TF_MPT_* "
    "setting cannot be used; the message says why",
}
# Older spellings still accepted, each with one line to stderr naming the one to use
_OLD_SPELLINGS = {
    "--convert-variables": "--variables half",
    "--keep-variables": "--variables float32",
    "--keep-io-types": "no flag: inputs and outputs keep their dtypes by default",
}


def _version():
    """'tf-mpt X (TensorFlow Y)', TensorFlow's version read from its installed metadata (no
    TensorFlow import)."""
    import importlib.metadata as metadata  # pylint: disable=g-import-not-at-top
    from tf_mpt import __version__  # pylint: disable=g-import-not-at-top
    found = "not installed"
    for name in ("tensorflow-cpu", "tensorflow", "tensorflow-intel", "tf-nightly"):
        try:
            found = metadata.version(name)
            break
        except metadata.PackageNotFoundError:
            continue
    return f"tf-mpt {__version__} (TensorFlow {found})"


class _Version(argparse.Action):
    """--version: prints _version() and exits 0 (argparse's own would need the text up
    front)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print tf-mpt's and TensorFlow's versions and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version())
        parser.exit(EXIT_OK)


def build_parser():
    """tf-mpt's argument parser (docs/cli.md's flag table is made from it: flag_table)."""
    parser = argparse.ArgumentParser(
        prog="tf-mpt", description="tf_mpt: mixed precision for TensorFlow graphs.",
        epilog="exit codes: " + "; ".join(f"{code} {text.split(':')[0]}"
                                          for code, text in EXIT_CODES.items()))
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run an unmodified script in mixed precision")
    run.add_argument("script", help="the Python script, run as __main__ with TF_MPT_ENABLE=1")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    convert = commands.add_parser("convert", help="convert a frozen graph or a SavedModel")
    convert.add_argument("src", help="a SavedModel directory or a frozen GraphDef file (.pb)")
    convert.add_argument("dst", help="where the converted model goes (must not exist)")
    commands.add_parser("cpu", help="this machine's half-precision facts and what "
                        "TF_MPT_DTYPE=auto picks here")
    commands.add_parser("doctor", help="whether TF_MPT_ENABLE=1 works in this environment "
                        "(the start-up hook) and what it would do here")
    cache = commands.add_parser("cache", help="what tf_mpt's cache directory holds "
                                "(TF_MPT_CACHE_DIR)")
    cache.add_argument("--clear", action="store_true",
                       help="remove tf_mpt's files from it (its kernel times, graph verdicts, "
                       "compiled optimizer: made again when next needed)")
    inspect_ = commands.add_parser("inspect", help="what a conversion would do, per op type")
    inspect_.add_argument("src", help="a SavedModel directory or a frozen GraphDef file (.pb)")
    inspect_.add_argument("--tensorboard", metavar="LOGDIR",
                          help="write the converted graph, nodes annotated, for TensorBoard")
    inspect_.add_argument("--numerics", action="store_true",
                          help="run sample inputs through the float32 model and report "
                          "tensors outside the half type's range")
    inspect_.add_argument("--blame", action="store_true",
                          help="with --numerics: run the float32 and the converted model once "
                          "and name the nodes whose own half error jumps beyond their "
                          "inputs' (what --auto-deny keeps float32)")
    measure = commands.add_parser("measure", help="time float32 and half kernels on this CPU "
                                  "and write a cost table for --target FILE on any machine")
    measure.add_argument("--out", required=True, metavar="FILE", help="the table to write")
    measure.add_argument("--dtype", choices=("both", "bfloat16", "float16"), default="both",
                         help="the half type(s) to time")
    measure.add_argument("--model", metavar="SAVED_MODEL|GRAPH.pb",
                         help="also time every matrix product and convolution of this model at "
                         "its own shapes (as `convert` would ask this machine)")
    convert.add_argument("--dtype", choices=("float16", "bfloat16", "float32"),
                         default="float16", help="the half type to convert to; a model tf_mpt "
                         "converted goes back to float32 first (float32: only that)")
    inspect_.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                          help="the half type the conversion would use")
    for sub in (convert, inspect_):
        sub.add_argument("--json", action="store_true",
                         help="print the report(s), each with its verdict, as one JSON "
                         "document on stdout (the other lines go to stderr)")
        sub.add_argument("--target", metavar="here|rules|auto|FILE",
                         help="the machine the decisions are for: rules (the op lists: a GPU "
                         "or any machine nobody measured), here (this CPU, measured), FILE (a "
                         "table from `tf-mpt measure` on the target machine); default "
                         "TF_MPT_TARGET, else auto (here for bfloat16 on a CPU with native "
                         "bfloat16, else rules)")
        sub.add_argument("--deny", default="", metavar="OP,...",
                         help="comma-separated op types kept float32")
        sub.add_argument("--no-timing", action="store_true",
                         help="with target here: decide by the prediction alone, without "
                         "timing the graph's candidate colourings on this CPU "
                         "(TF_MPT_TIMING_BUDGET=0)")
        sub.add_argument("--samples", type=int, default=8, metavar="N",
                         help="random sample inputs for --validate and --numerics")
        sub.add_argument("--inputs", metavar="FILE.npz",
                         help="sample inputs: one array per input name, fed as they are (in "
                         "place of random ones)")
        sub.add_argument("--seed", type=int, default=0,
                         help="seed of the random sample inputs")
    convert.add_argument("--keep-fp32", default="", metavar="NODE,...",
                         help="comma-separated node names kept float32")
    convert.add_argument("--keep-io-types", dest="keep_io_types", action="store_true",
                         default=True, help=argparse.SUPPRESS)
    convert.add_argument("--no-keep-io-types", dest="keep_io_types", action="store_false",
                         help="frozen graphs: inputs and outputs may be half precision")
    convert.add_argument("--variables", choices=("float32", "half"), default="float32",
                         help="SavedModels: keep variables float32, or store those only half "
                         "ops read in the --dtype (checkpoint rewritten)")
    convert.add_argument("--convert-variables", dest="variables", action="store_const",
                         const="half", help=argparse.SUPPRESS)
    convert.add_argument("--keep-variables", dest="variables", action="store_const",
                         const="float32", help=argparse.SUPPRESS)
    convert.add_argument("--force", action="store_true",
                         help="convert a model tf_mpt already converted as it is, on top of its "
                         "conversion (default: undo that conversion first)")
    convert.add_argument("--validate", nargs="?", type=int, const=0, default=None, metavar="N",
                         help="compare --samples random samples (or --inputs) with float32: "
                         "each output's relative L2 error (float16 1e-2, bfloat16 8e-2) and, "
                         "for class scores, top-1 agreement (90%%); a failure exits 1 and "
                         "writes nothing. (`--validate N`, the older spelling: N samples)")
    convert.add_argument("--rtol", type=float, help="also require every element within atol + "
                         "rtol * |float32| (float16 1e-2, bfloat16 5e-2 where only --atol is "
                         "given)")
    convert.add_argument("--atol", type=float, help="also require every element within atol + "
                         "rtol * |float32| (float16 1e-2, bfloat16 5e-2 where only --rtol is "
                         "given)")
    convert.add_argument("--auto-deny", action="store_true",
                         help="if validation fails, find the nodes to keep float32 (one-pass "
                         "blame, validated once; bisection if that does not pass)")
    convert.add_argument("--bisect", action="store_true",
                         help="with --auto-deny: bisection only (no one-pass blame)")
    return parser


def _old_spellings(argv, command):
    """One line to stderr per older spelling in `argv` (still accepted)."""
    for arg in argv:
        name = str(arg).split("=")[0]
        if name in _OLD_SPELLINGS:
            sys.stderr.write(f"tf-mpt {command}: {name} is an older spelling ("
                             f"{_OLD_SPELLINGS[name]}); it still works\n")


def flag_table(parser=None):
    """docs/cli.md's flag table, as markdown lines: per command, each flag or argument, its
    default and what it does, from the parser itself (a test holds the docs to it)."""
    parser = parser or build_parser()

    def cell(text):
        return " ".join(str(text).replace("%%", "%").split()).replace("|", "\\|")

    lines = ["| command | flag | default | what it does |", "|---|---|---|---|"]
    rows = [("", None, action) for action in parser._actions  # pylint: disable=W0212
            if action.option_strings and action.help != argparse.SUPPRESS]
    commands = next(a for a in parser._actions  # pylint: disable=protected-access
                    if isinstance(a, argparse._SubParsersAction))  # pylint: disable=W0212
    helps = {choice.dest: choice.help
             for choice in commands._choices_actions}  # pylint: disable=W0212
    for name, sub in commands.choices.items():
        rows.append((name, helps.get(name, ""), None))
        rows += [(name, None, action) for action in sub._actions  # pylint: disable=W0212
                 if action.help != argparse.SUPPRESS and
                 not isinstance(action, argparse._HelpAction)]  # pylint: disable=W0212
    for name, command_help, action in rows:
        if action is None:  # (the command itself)
            lines.append(f"| {name} | | | {cell(command_help)} |")
            continue
        value = action.metavar or ("/".join(action.choices) if action.choices else
                                   action.dest.upper())
        if action.option_strings:
            flag = ", ".join(action.option_strings)
            if action.nargs == "?":
                flag += f" [{value}]"
            elif action.nargs != 0:
                flag += f" {value}"
        else:
            flag = value + (" ..." if action.nargs == argparse.REMAINDER else "")
        takes_value = action.option_strings and action.nargs not in (0, "?")
        shown = f"`{action.default}`" if takes_value and action.default not in (
            None, "", argparse.SUPPRESS) else ""
        lines.append(f"| {name or '(any)'} | `{cell(flag)}` | {shown} | {cell(action.help)} |")
    return lines


def exit_code_table():
    """docs/cli.md's exit code table, as markdown lines (EXIT_CODES)."""
    return ["| exit code | meaning |", "|---|---|"] + [
        f"| {code} | {text} |" for code, text in EXIT_CODES.items()]


def main(argv=None):
    """Entry point of the `tf-mpt` console command. `tf-mpt run` exits as the script does;
    every other command with one of EXIT_CODES (an unexpected error: EXIT_INTERNAL, after
    its traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options = build_parser().parse_args(argv)
    _old_spellings(argv, options.command)
    if options.command == "run":
        _run(options.script, options.args)
        return
    try:
        _command(options)
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as error:  # pylint: disable=broad-except
        import traceback  # pylint: disable=g-import-not-at-top
        traceback.print_exc()
        sys.stderr.write(f"tf-mpt {options.command}: internal error ({type(error).__name__}: "
                         f"{error}); nothing was written. Please report it with the "
                         "traceback above.\n")
        raise SystemExit(EXIT_INTERNAL) from None


def _command(options):
    """Runs every command but `run` (main's)."""
    if options.command == "cpu":
        _cpu_command()
        return
    if options.command == "doctor":
        _doctor_command()
        return
    if options.command == "cache":
        _cache_command(options)
        return
    from tf_mpt.models import model_io as _model_io  # pylint: disable=g-import-not-at-top
    from tf_mpt import rewrite  # pylint: disable=g-import-not-at-top
    from tf_mpt.rewrite.graph_view import GraphDefError  # pylint: disable=g-import-not-at-top
    if options.command == "convert" and options.validate not in (None, 0):
        options.samples = options.validate  # (the older spelling: --validate N)
        sys.stderr.write("tf-mpt convert: --validate N is an older spelling (--validate "
                         "--samples N); it still works\n")
    if options.command == "convert":
        options.validate = options.validate is not None
    try:
        if options.command == "measure":
            _measure_command(options)
            return
        if getattr(options, "json", False):  # (stdout holds the JSON document alone)
            with contextlib.redirect_stdout(sys.stderr):
                options.config = _config_of(options)
                found = (_convert_command if options.command == "convert" else
                         _inspect_command)(options)
            print(json.dumps(found, indent=1))
            return
        options.config = _config_of(options)
        (_convert_command if options.command == "convert" else _inspect_command)(options)
    except _model_io.ModelError as error:
        sys.stderr.write(f"tf-mpt {options.command}: {error}\n")
        code = (EXIT_USAGE if isinstance(error, _model_io.UsageError) else
                EXIT_VALIDATION_FAILED if isinstance(error, _model_io.ValidationFailed) else
                EXIT_BAD_INPUT)
        raise SystemExit(code) from None
    except GraphDefError as error:
        sys.stderr.write(f"tf-mpt {options.command}: {options.src!r} holds a malformed graph: "
                         f"{error}\n")
        raise SystemExit(EXIT_BAD_INPUT) from None
    except rewrite.RewriteError as error:
        sys.stderr.write(f"tf-mpt {options.command}: the rewrite failed inside tf_mpt ({error});"
                         " nothing was written. Please report it with the model; --deny or "
                         "--keep-fp32 on the op named may work around it.\n")
        raise SystemExit(EXIT_INTERNAL) from None
