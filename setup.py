"""fairseq-struct: five Transformer variants from the literature as a fairseq --user-dir."""
from setuptools import find_packages, setup


def _requirements(path):
    with open(path) as f:
        return [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]


setup(
    name="fairseq-struct",
    version="0.1.0",
    description=__doc__,
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["user_dir", "user_dir.*"]),
    # fairseq itself is not listed: on Python 3.11 it comes from `ve-fairseq`
    # or `fairseq-fixed` (installed with --no-deps), on Python <= 3.10 from
    # `fairseq==0.12.2`. See README.md, "Install".
    install_requires=_requirements("requirements.txt"),
    extras_require={
        "test": ["pytest", "pytest-xdist"],
        "oracles": ["transformers==4.35.2", "fastNLP==1.0.1", "rich==11.2.0", "prettytable", "setuptools<82"],
    },
    license="MIT",
)
