"""The languages a sandbox runs: how each is built and run, by name or alias.

Commands are argv templates run inside the item's sandbox. Placeholders: ``{python}`` the
sandbox's Python interpreter, ``{prog}`` the folder holding the program's files and its
build (read-only once built), ``{source}`` the main source file's name, ``{memory_mb}`` the
run's memory limit. Toolchains are found on the sandbox's ``PATH``
(:data:`SANDBOX_PATH`), bound read-only from the host: a compiler installed elsewhere (for
example rustup's, under ``/root``) is not there.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``PATH`` inside the sandbox (and of every build and run).
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"

# The JVM reserves address space it never touches (code cache, class space, thread stacks,
# the CDS archive, a 64 MiB malloc arena per thread): with these flags and two malloc arenas
# it peaks at about heap + 600 MiB (measured, JDK 17), so it runs under RLIMIT_AS = heap +
# 1 GiB, and its own threads (13) stay well within the process limit.
_JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:CICompilerCount=1",
    "-XX:ReservedCodeCacheSize=64m",
    "-XX:CompressedClassSpaceSize=64m",
    "-XX:MaxMetaspaceSize=192m",
    "-Xshare:auto",
)


@dataclass(frozen=True)
class Language:
    """How one language is built and run in the sandbox."""

    name: str
    source: str
    """The main source file's name in the work directory (``main.py``, ``Main.java``)."""
    run: tuple[str, ...]
    """argv of one run (templates, see the module's docstring). Unused for ``warm``."""
    compile: tuple[str, ...] | None = None
    """argv of the build, run once per item in the program's folder; None: nothing to build."""
    aliases: tuple[str, ...] = ()
    warm: bool = False
    """Runs are forked from the item's warm Python interpreter (the code compiled once)."""
    extra_memory_mb: int = 0
    """Address space the runtime reserves on top of the program's ``memory_mb``."""
    compile_memory_mb: int = 2048
    """Address space of the build (at least; the run's limit when larger)."""
    compile_processes: int = 256
    """Processes and threads of the build (at least)."""
    memory_markers: tuple[str, ...] = ()
    """Text in a failed run's stderr that means the program ran out of memory."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment of its builds and runs, on top of the sandbox's."""

    def tools(self) -> tuple[str, ...]:
        """Executables the sandbox must find (``{python}`` for the interpreter)."""
        names = []
        for argv in (self.compile, () if self.warm else self.run):
            if argv and not argv[0].startswith("{prog}"):
                names.append(argv[0])
        if self.warm:
            names.append("{python}")
        return tuple(dict.fromkeys(names))


LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in (
        Language(
            name="python",
            source="main.py",
            run=("{python}", "{source}"),
            aliases=("py", "python3"),
            warm=True,
            memory_markers=("MemoryError",),
        ),
        Language(
            name="c",
            source="main.c",
            compile=("gcc", "-O2", "-std=gnu11", "-o", "{prog}/main", "{source}", "-lm"),
            run=("{prog}/main",),
        ),
        Language(
            name="cpp",
            source="main.cpp",
            compile=("g++", "-O2", "-std=gnu++17", "-o", "{prog}/main", "{source}"),
            run=("{prog}/main",),
            aliases=("c++", "cxx"),
            memory_markers=("std::bad_alloc",),
        ),
        Language(
            name="java",
            source="Main.java",
            compile=(
                "javac",
                "-J-Xmx512m",
                *(f"-J{flag}" for flag in _JVM_FLAGS),
                "-encoding",
                "UTF-8",
                "-d",
                "{prog}",
                "{source}",
            ),
            run=("java", "-Xmx{memory_mb}m", "-Xss16m", *_JVM_FLAGS, "-cp", "{prog}", "Main"),
            extra_memory_mb=1024,
            compile_memory_mb=2048,
            memory_markers=("java.lang.OutOfMemoryError",),
            env=(("MALLOC_ARENA_MAX", "2"),),
        ),
        Language(
            name="javascript",
            source="main.js",
            run=("node", "--max-old-space-size={memory_mb}", "{source}"),
            aliases=("js", "node", "nodejs"),
            # node reserves about 700 MiB before its heap grows (v20).
            extra_memory_mb=1024,
            memory_markers=("JavaScript heap out of memory", "Fatal process out of memory"),
            env=(("MALLOC_ARENA_MAX", "2"),),
        ),
        Language(
            name="rust",
            source="main.rs",
            compile=("rustc", "-O", "--edition=2021", "-o", "{prog}/main", "{source}"),
            run=("{prog}/main",),
            aliases=("rs",),
            compile_memory_mb=4096,
            memory_markers=("memory allocation of",),
        ),
        Language(
            name="bash",
            source="main.sh",
            compile=("bash", "-n", "{source}"),
            run=("bash", "{source}"),
            aliases=("sh", "shell"),
        ),
    )
}

_BY_ALIAS: dict[str, Language] = {
    key: lang for lang in LANGUAGES.values() for key in (lang.name, *lang.aliases)
}


def language(name: str) -> Language:
    """The language called ``name`` or one of its aliases (case-insensitive)."""
    found = _BY_ALIAS.get(name.strip().lower())
    if found is None:
        known = ", ".join(
            f"{lang.name} ({', '.join(lang.aliases)})" if lang.aliases else lang.name
            for lang in LANGUAGES.values()
        )
        raise ValueError(f"unknown language {name!r}; supported: {known}")
    return found
