"""Outputs by what they are (issue 68): the atomic writer (numformer/files.py) renamed its temporary over
whatever the output path was. At 4439216 a symbolic link given as ``translate.py --output`` was replaced by a
file while its target kept the old text, a character device given as ``export --out`` became a regular file (as
root, ``--out /dev/stdout`` would replace the system's node) and a named pipe given to ``average --out`` became a
3.7 MB file while its reader got nothing. Now a link is written through (its target replaced, the link kept), a
device, a named pipe or a socket is written into and never replaced, and the preflight refuses, naming the kind,
such an output where a folder goes and a link that loops."""
import os
import socket
import stat
import threading

import pytest

import translate
from numformer.checkpoint import load_checkpoint
from numformer.checkpoint_command import main as checkpoint_main
from support import assert_one_line_error, run_main

CHECKPOINT = "python -m numformer.checkpoint"


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a b c\nd e\n", encoding="utf-8")
    return path


def translate_to(run, text, output, capsys):
    return run_main(translate.main, ["--model", str(run), "--input", str(text), "--output", str(output), "--greedy"],
                    capsys)


def test_a_symbolic_link_output_is_written_through_and_kept(copy_run, text, tmp_path, capsys):
    """``--output latest.txt`` where latest.txt links to today's file: the target gets the translation, the link
    stays a link to it."""
    target = tmp_path / "today.txt"
    target.write_text("yesterday's translation\n", encoding="utf-8")
    link = tmp_path / "latest.txt"
    link.symlink_to(target.name)
    code, _, err = translate_to(copy_run, text, link, capsys)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == target.name
    assert len(target.read_text(encoding="utf-8").splitlines()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "latest.txt", "today.txt"]  # no temporary left


def test_a_dangling_link_output_creates_its_target(copy_run, text, tmp_path, capsys):
    link = tmp_path / "latest.txt"
    link.symlink_to("new.txt")
    code, _, err = translate_to(copy_run, text, link, capsys)
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "new.txt").is_file()


def a_device(tmp_path):
    """A character device the test may write into: a null device made here (as root), else a link to /dev/null
    (which another user cannot replace, but a link to it can be)."""
    path = tmp_path / "device.npz"
    if os.geteuid() == 0:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the null device's numbers on Linux
    else:
        path.symlink_to("/dev/null")
    return path


def test_a_character_device_output_is_written_into_never_replaced(copy_run, tmp_path, capsys):
    device = a_device(tmp_path)
    code, out, err = run_main(checkpoint_main, ["export", str(copy_run), "--out", str(device)], capsys)
    assert code == 0, err
    assert stat.S_ISCHR(os.stat(device).st_mode)  # still the device (through its link, where it is one)
    assert device.is_symlink() == (os.geteuid() != 0)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["device.npz"]


def test_a_device_without_a_suffix_takes_the_format_from_the_flag(copy_run, tmp_path, capsys):
    """/dev/stdout says no format by its name: ``--format`` tells it; without one, one line asks for it."""
    device = a_device(tmp_path).rename(tmp_path / "sink")
    code, _, err = run_main(checkpoint_main, ["export", str(copy_run), "--out", str(device)], capsys)
    assert_one_line_error(code, err, CHECKPOINT, "whose name does not say a format: give --format npz|safetensors")
    code, _, err = run_main(checkpoint_main, ["export", str(copy_run), "--format", "safetensors", "--out",
                                              str(device)], capsys)
    assert code == 0, err
    assert stat.S_ISCHR(os.stat(device).st_mode)


def test_a_named_pipe_output_gets_the_bytes_and_stays_a_pipe(copy_run, tmp_path, capsys):
    """``average --out fifo.npz``: the reader gets the whole model file; the pipe is still a pipe."""
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    keep = tmp_path / "fifo-kept"
    os.link(fifo, keep)  # the pipe under a second name: a reader left waiting on a replaced one can be let go
    got = []
    reader = threading.Thread(target=lambda: got.append(open(keep, "rb").read()), daemon=True)
    reader.start()
    code, _, err = run_main(checkpoint_main, ["average", "--last", "2", str(copy_run), "--out", str(fifo)], capsys)
    if reader.is_alive():  # the pipe was never opened for writing: release the reader
        os.close(os.open(keep, os.O_WRONLY | os.O_NONBLOCK))
    reader.join(30)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert got and len(got[0]) > 100_000, "the pipe's reader got nothing"
    received = tmp_path / "received.npz"
    received.write_bytes(got[0])
    assert load_checkpoint(received, with_optimizer=False).model


def test_a_socket_output_is_connected_to_and_written_into(copy_run, text, tmp_path, capsys):
    path = tmp_path / "out.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(60)
    got = []

    def serve():
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            got.append(b"".join(iter(lambda: conn.recv(65536), b"")))
    listener = threading.Thread(target=serve, daemon=True)
    listener.start()
    try:
        code, _, err = translate_to(copy_run, text, path, capsys)
    finally:
        listener.join(5)
        server.close()
    assert code == 0, err
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert got and len(got[0].decode("utf-8").splitlines()) == 2


def test_the_preflight_refuses_a_pipe_where_a_folder_goes_naming_it(copy_run, tmp_path, capsys):
    fifo = tmp_path / "hf"
    os.mkfifo(fifo)
    code, _, err = run_main(checkpoint_main, ["export", str(copy_run), "--format", "hf", "--out", str(fifo)], capsys)
    assert_one_line_error(code, err, CHECKPOINT, "is a named pipe")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_link_that_loops_is_one_line(copy_run, text, tmp_path, capsys):
    loop = tmp_path / "loop.txt"
    loop.symlink_to("loop.txt")
    code, _, err = translate_to(copy_run, text, loop, capsys)
    assert_one_line_error(code, err, "translate.py", "is a symbolic link that loops")
    assert loop.is_symlink()
