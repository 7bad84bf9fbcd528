"""The prepare step as a KFP component (component.py) over ampbench.data."""
