"""python -m tf_mpt script.py [args...]: run an unmodified script in mixed precision."""

from tf_mpt import cli

if __name__ == "__main__":
    cli.run_script_main()
