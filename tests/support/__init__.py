"""The tests' harness: nodes as processes and in this process (nodes.py, inprocess.py),
waiting for a condition with a deadline (wait.py), and the helpers several test modules
share. Test modules import from here, never from one another."""
