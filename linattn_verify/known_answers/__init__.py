"""The known-answer vectors (README.md beside this file): manifest.json and vectors/, the
package data of linattn_verify.known_answers (pyproject.toml), so that linattn_verify.kat
finds them from any folder."""
