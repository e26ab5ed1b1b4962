import random

import pytest

from experience.distill.shell import shlex_words, split_words

COMMANDS = [
    "",
    "   ",
    "ls",
    "pytest -x tests/test_dates.py",
    "cd /repo && python -m pytest tests/test_a.py::test_b -k 'x and not y' 2>&1 | tail -20",
    "cd /repo&&pytest;echo done",
    "python reproduce.py > out.log 2>&1; cat out.log",
    'python -c "import a; print(a.b)"',
    "grep -rn 'def foo' src/ | head",
    'echo "a \\"quoted\\" word" >> notes.txt',
    "sed -i 's/old/new/g' src/a.py && git diff",
    "cat > check.py <<'EOF'\nimport a\nprint(a)\nEOF\npython check.py",
    "cat <<EOF > t.py\nx = 1\nEOF",
    "python - <<< 'print(1)'",
    "ls # a comment",
    "echo a#b c",
    "find . -name '*.py' -exec grep -l foo {} \\;",
    "a\\ b c",
    "line one \\\n line two",
    "(cd sub; make) || exit 1",
    "cmd1 |& cmd2 & cmd3",
    "x=1 y=2 env | sort >| sorted.txt",
    "echo 'unbalanced",
    'echo "unbalanced',
    "trailing escape \\",
    "tab\tseparated\twords\r\nand lines",
    "unicode caf\u00e9 \u00a0nbsp\u2003em-space",
    "vertical\x0bform\x0cfeed",
    "echo $HOME ${PATH} `pwd` $(date) ~/x *.py ?.txt a=b,c:d@e%f^g+h![i]{j}",
    "go test ./... ; npm test ;; done",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_split_words_reads_the_words_shlex_reads(command):
    assert split_words(command) == shlex_words(command)


def test_split_words_matches_shlex_on_random_commands():
    # Mostly the characters of commands that take the fast path, some quotes, escapes and comments.
    alphabet = "abcxyz019 \t\n\r;&|<>()-./=*?~$`{}[]!,:@%+\u00e9\u00a0\x0b" + "'\"\\#"
    chooser = random.Random(7)
    for _ in range(3000):
        command = "".join(chooser.choice(alphabet) for _ in range(chooser.randint(0, 40)))
        assert split_words(command) == shlex_words(command), command


def test_split_words_keeps_shlex_operators_whole():
    assert split_words("a&&b||c 2>&1 >>f |& g; (h)") == [
        "a", "&&", "b", "||", "c", "2", ">&", "1", ">>", "f", "|&", "g", ";", "(", "h", ")",
    ]  # fmt: skip


def test_split_words_hands_out_a_fresh_list_each_time():
    words = split_words("pytest tests")
    words.append("mutated")

    assert split_words("pytest tests") == ["pytest", "tests"]


def test_split_words_matches_shlex_on_random_quoted_commands():
    # Quotes without escapes or comments: the second fast path, and unclosed quotes handed to shlex.
    alphabet = "abc01 \t\n;&|<>()-./=*$'''\"\"\""
    chooser = random.Random(11)
    for _ in range(3000):
        command = "".join(chooser.choice(alphabet) for _ in range(chooser.randint(0, 30)))
        assert split_words(command) == shlex_words(command), command


def test_split_words_drops_quotes_and_keeps_quoted_operators_in_the_word():
    assert split_words("""sed -i 's/a(/b(/' x.py&&python -c "import a; a.b()"''""") == [
        "sed", "-i", "s/a(/b(/", "x.py", "&&", "python", "-c", "import a; a.b()",
    ]  # fmt: skip
    assert split_words("echo '' \"\" x''y") == ["echo", "", "", "xy"]


def test_split_words_matches_shlex_on_random_commands_with_comments():
    # Comments without quotes or escapes: cut out before the plain split, mid-word and across lines too.
    alphabet = "abc01 \t\n\r;&|<>()-./=*\u00a0\x0b\x85\u2028" + "###"
    chooser = random.Random(13)
    for _ in range(3000):
        command = "".join(chooser.choice(alphabet) for _ in range(chooser.randint(0, 40)))
        assert split_words(command) == shlex_words(command), command


def test_split_words_ends_a_word_at_a_comment_and_reads_the_next_line():
    assert split_words("ls -la # 3.7\npytest a#b|c\r# x\ntail") == ["ls", "-la", "pytest", "a", "tail"]
    assert split_words("make&&#done\nx") == ["make", "&&", "x"]
