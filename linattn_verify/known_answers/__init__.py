"""The known-answer vectors (README.md beside this file), installed as the package
linattn_verify.known_answers: pyproject.toml maps this folder there (package-dir) and ships
manifest.json and vectors/ as its package data, so that linattn_verify.kat finds them from any
folder. This file makes the folder a regular package: an editable install maps a package-dir
entry only when it is one (a namespace package is not found: pypa/setuptools#4943)."""
