# pytest setup for msa's Python tests: puts this folder on sys.path so the test files share the
# reference modules (np_reference.py, torch_reference.py) without a package.
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
