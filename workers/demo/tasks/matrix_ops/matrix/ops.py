"""Dense matrices as lists of rows."""

Matrix = list[list[float]]


def shape(m: Matrix) -> tuple[int, int]:
    return len(m), (len(m[0]) if m else 0)


def transpose(m: Matrix) -> Matrix:
    return [list(col) for col in zip(*m, strict=True)]


def identity(n: int) -> Matrix:
    return [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]


def add(a: Matrix, b: Matrix) -> Matrix:
    if shape(a) != shape(b):
        raise ValueError(f"shapes differ: {shape(a)} vs {shape(b)}")
    return [[x + y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]


def matmul(a: Matrix, b: Matrix) -> Matrix:
    rows, inner = shape(a)
    inner_b, cols = shape(b)
    if inner != inner_b:
        raise ValueError(f"cannot multiply {shape(a)} by {shape(b)}")
    return [[sum(a[i][k] * b[k][j] for k in range(rows)) for j in range(cols)] for i in range(rows)]


def power(m: Matrix, n: int) -> Matrix:
    """m to the n-th power by repeated squaring (n >= 0, m square)."""
    size, other = shape(m)
    if size != other:
        raise ValueError("power() needs a square matrix")
    result, base = identity(size), m
    while n > 0:
        if n & 1:
            result = matmul(result, base)
        base = matmul(base, base)
        n >>= 1
    return result
