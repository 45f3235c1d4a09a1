"""What the tests import or run, none of it a test: named tolerances, graph helpers, the
digits and LSTM set-ups, the model corpus, Grappler's oracle, and the worker scripts that
test_distribution.py and test_session_patterns.py run in subprocesses.

    tolerances.py      named tolerances and the assertions that use them
    helpers.py         build, rewrite and run graphs; read dtypes and Casts; the CLI in-process
    digits.py, conv_net.py, lstm.py, model_corpus.py    models and data
    grappler_oracle.py Grappler's AMP on the same graphs, in a child process
    tf1_patterns.py, *_worker.py                         scripts run in subprocesses
"""
