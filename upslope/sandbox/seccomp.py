"""A small seccomp filter for sandboxed programs (classic BPF, handed to bubblewrap's --seccomp).

It refuses (EPERM) the system calls that untrusted code has no use for and that widen the
kernel's attack surface: new namespaces (unshare, setns, clone with CLONE_NEW*), mounts,
ptrace and cross-process memory access, kernel keyrings, eBPF, perf events, userfaultfd,
io_uring, module and kexec loading, and a few host-administration calls; and sockets other
than unix sockets (EAFNOSUPPORT). clone3 answers
ENOSYS, because its flags sit in memory a filter cannot read: the C library then falls
back to clone, whose flags the filter does check. Everything else is allowed.

Only x86_64 and aarch64 have tables here; on other machines no filter is applied.
"""
import errno
import platform
import struct

# (x86_64, aarch64) numbers, from asm/unistd_64.h and asm-generic/unistd.h.
_BLOCKED = {
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "syslog": (103, 116),
    "acct": (163, 89),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "quotactl": (179, 60),
}
_CLONE = (56, 220)
_CLONE3 = (435, 435)
# socket() and socketpair(): unix sockets only. The buffers of TCP, UDP, netlink and other
# sockets are kernel memory that cgroup v1 (and the rlimit fallback) do not charge to the
# run: 100 loopback TCP connections queued 1 GiB outside a 1 GiB run limit.
_SOCKET = ((41, 198), (53, 199))
_AF_UNIX = 1
_ARCHES = {"x86_64": (0, 0xC000003E), "amd64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7), "arm64": (1, 0xC00000B7)}
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# classic BPF opcodes and seccomp return values
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000
_X32_BIT = 0x40000000


def supported() -> bool:
    return platform.machine().lower() in _ARCHES


def build_filter(machine: str | None = None) -> bytes:
    """The filter as an array of `struct sock_filter`, for this machine's architecture."""
    column, audit_arch = _ARCHES[(machine or platform.machine()).lower()]
    prog: list[tuple[int, str | int, str | int, int]] = []  # (code, jt, jf, k); jt/jf may be labels

    def jump_to_label_if(op: int, k: int, label: str) -> None:
        prog.append((op, label, 0, k))

    prog.append((_LD_W_ABS, 0, 0, 4))  # seccomp_data.arch
    prog.append((_JEQ, 1, 0, audit_arch))
    prog.append((_RET, 0, 0, _KILL))  # a syscall of another ABI: never expected
    prog.append((_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
    if column == 0:
        jump_to_label_if(_JGE, _X32_BIT, "eperm")  # the x32 ABI's numbers
    for numbers in _BLOCKED.values():
        jump_to_label_if(_JEQ, numbers[column], "eperm")
    jump_to_label_if(_JEQ, _CLONE3[column], "enosys")
    jump_to_label_if(_JEQ, _CLONE[column], "clone")
    for numbers in _SOCKET:
        jump_to_label_if(_JEQ, numbers[column], "socket")
    prog.append((_RET, 0, 0, _ALLOW))
    labels = {"clone": len(prog)}
    prog.append((_LD_W_ABS, 0, 0, 16))  # low half of args[0]: clone's flags
    jump_to_label_if(_JSET, _CLONE_NEW_MASK, "eperm")
    prog.append((_RET, 0, 0, _ALLOW))
    labels["socket"] = len(prog)
    prog.append((_LD_W_ABS, 0, 0, 16))  # args[0]: the address family
    prog.append((_JEQ, 0, 1, _AF_UNIX))
    prog.append((_RET, 0, 0, _ALLOW))
    prog.append((_RET, 0, 0, _ERRNO | errno.EAFNOSUPPORT))
    labels["eperm"] = len(prog)
    prog.append((_RET, 0, 0, _ERRNO | errno.EPERM))
    labels["enosys"] = len(prog)
    prog.append((_RET, 0, 0, _ERRNO | errno.ENOSYS))

    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise AssertionError("seccomp filter jump out of range")
        out += struct.pack("=HBBI", code, jt, jf, k)
    return bytes(out)
