"""Implementations for the vet tests, loaded by path in vet's worker process: a correct one,
and ones that raise, crash the process, or hang."""

import ctypes
import time

import linattn_verify as lv


def elu_linear(q, k, v):
    return lv.attention(q, k, v, "elu", form="linear")


def raising(q, k, v):
    raise ValueError("this kernel always fails")


def crashing(q, k, v):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def hanging(q, k, v):
    time.sleep(3600)


def performer(q, k, v, projection):
    return lv.attention(q, k, v, "performer-positive", projection=projection, form="linear")
