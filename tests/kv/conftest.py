import os
import sys

# Make the shared scaffolding (kvworld.py) importable whatever pytest's import mode is.
sys.path.insert(0, os.path.dirname(__file__))
