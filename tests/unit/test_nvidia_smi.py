from sparkfleet.host.nvidia_smi import GpuReport, at_least, parse_nvidia_smi

# As a DGX Spark prints it (public GB10 output): memory reads "Not Supported".
GB10 = """\
Mon Nov 30 06:37:49 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA GB10                    On  |   0000000F:01:00.0  On |                  N/A |
| N/A   42C    P0             11W /  N/A  | Not Supported          |      0%      Default |
|                                         |                        |                  N/A |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|    0   N/A  N/A            3094      G   /usr/lib/xorg/Xorg                       43MiB |
+-----------------------------------------------------------------------------------------+
"""

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def test_gb10_table():
    report = parse_nvidia_smi(GB10)
    assert (report.name, report.driver, report.cuda, report.error) == ("NVIDIA GB10", "580.95.05", "13.0", None)


def test_newer_driver_and_other_gpu():
    text = GB10.replace("580.95.05", "590.44.01").replace("13.0 ", "13.1 ").replace("NVIDIA GB10 ", "NVIDIA H100 ")
    report = parse_nvidia_smi(text)
    assert (report.name, report.driver, report.cuda) == ("NVIDIA H100", "590.44.01", "13.1")


def test_no_driver_is_an_error_not_a_crash():
    report = parse_nvidia_smi(NO_DRIVER)
    assert report.driver is None and "couldn't communicate" in report.error


def test_version_minimums():
    assert at_least("580.95.05", "580.95.05")
    assert at_least("580.126.09", "580.95.05")  # 126 > 95 numerically, not as text
    assert not at_least("550.54.14", "580.95.05")
    assert not at_least(None, "13.0")
    assert at_least("13.0", "13.0") and not at_least("12.8", "13.0")


def test_cuda_version_not_available_is_an_error_not_a_version():
    report = parse_nvidia_smi(GB10.replace("CUDA Version: 13.0 ", "CUDA Version: N/A  "))
    assert report == GpuReport(None, None, None, error="nvidia-smi reads CUDA Version: N/A, not a version")


def test_driver_version_not_available_is_an_error():
    report = parse_nvidia_smi(GB10.replace("Driver Version: 580.95.05", "Driver Version: N/A"))
    assert report.error == "nvidia-smi reads Driver Version: N/A, not a version"


def test_gpu_name_not_available_is_an_error():
    report = parse_nvidia_smi(GB10.replace("NVIDIA GB10                    On", "N/A                            On"))
    assert report == GpuReport(None, "580.95.05", "13.0", error="nvidia-smi lists no GPU name (reads N/A)")


def test_no_gpu_row_is_an_error():
    header_only = "\n".join(GB10.splitlines()[:3])
    assert parse_nvidia_smi(header_only).error == "nvidia-smi lists no GPU name (reads nothing)"


def test_no_output_is_an_error():
    assert parse_nvidia_smi("").error == "nvidia-smi printed no driver line (no output)"
