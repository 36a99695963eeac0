"""The request bodies the filtered engine socket passes, as models
(leviathd/enginesock/model.py): the fields of the Docker Engine API that the
docker CLI and compose send and the project supports. Every field here that
can change what a container may reach is read by leviathd/enginesock/rules.py;
a field the rules do not read is either harmless inside the container's own
namespaces (Hostname, Env, Tty) or a `zero` field.
"""

from __future__ import annotations

from leviathd.enginesock import model
from leviathd.enginesock.model import list_of, map_of, obj, strs, zero

BOOL, EMPTY, INT, LONG_STR, STR, STRS = (model.BOOL, model.EMPTY, model.INT, model.LONG_STR,
                                         model.STR, model.STRS)
Spec = model.Spec

_DEVICES = "devices and GPUs are not allowed: a device node is the host's hardware"
_WINDOWS = "it is a Windows engine's setting"
_HOST_FILE = "it names a file of the host"

HEALTHCHECK = obj(
    Test=strs(64, LONG_STR), Interval=INT, Timeout=INT, StartPeriod=INT, StartInterval=INT,
    Retries=INT,
)

LOG_CONFIG = obj(Type=STR, Config=map_of(STR, 16))

PORT_BINDING = obj(HostIp=STR, HostPort=STR)

MOUNT = obj(
    Type=STR, Source=STR, Target=STR, ReadOnly=BOOL,
    Consistency=STR,  # macOS' hint, ignored by the engine
    BindOptions=obj(Propagation=STR, NonRecursive=BOOL, ReadOnlyNonRecursive=BOOL,
                    ReadOnlyForceRecursive=BOOL, CreateMountpoint=BOOL),
    VolumeOptions=obj(NoCopy=BOOL, Labels=map_of(STR),
                      DriverConfig=zero("volume driver options are not allowed (a volume that "
                                        "binds a folder would bypass the bind checks)"),
                      Subpath=zero("a volume's subpath is not supported")),
    TmpfsOptions=obj(SizeBytes=INT, Mode=INT,
                     Options=zero("tmpfs mount options other than size and mode are not "
                                  "supported")),
)

ULIMIT = obj(Name=STR, Soft=INT, Hard=INT)

HOST_CONFIG = obj(
    Binds=strs(), ContainerIDFile=zero(_HOST_FILE), LogConfig=LOG_CONFIG, NetworkMode=STR,
    PortBindings=map_of(list_of(PORT_BINDING, 64)),
    RestartPolicy=obj(Name=STR, MaximumRetryCount=INT), AutoRemove=BOOL,
    VolumeDriver=STR, VolumesFrom=strs(), ConsoleSize=list_of(INT, 2),
    CapAdd=strs(64), CapDrop=strs(64), CgroupnsMode=STR, Dns=strs(64), DnsOptions=strs(64),
    DnsSearch=strs(64), ExtraHosts=strs(), GroupAdd=strs(64), IpcMode=STR, Cgroup=STR,
    Links=strs(), OomScoreAdj=INT, PidMode=STR, Privileged=BOOL, PublishAllPorts=BOOL,
    ReadonlyRootfs=BOOL, SecurityOpt=strs(64),
    StorageOpt=zero("storage options are the engine's"), Tmpfs=map_of(STR, 64),
    UTSMode=STR, UsernsMode=STR, ShmSize=INT, Sysctls=map_of(STR, 64), Runtime=STR,
    Isolation=zero(_WINDOWS), CpuShares=INT, Memory=INT, NanoCpus=INT, CgroupParent=STR,
    BlkioWeight=INT, BlkioWeightDevice=zero(_DEVICES), BlkioDeviceReadBps=zero(_DEVICES),
    BlkioDeviceWriteBps=zero(_DEVICES), BlkioDeviceReadIOps=zero(_DEVICES),
    BlkioDeviceWriteIOps=zero(_DEVICES), CpuPeriod=INT, CpuQuota=INT,
    CpuRealtimePeriod=zero("real-time scheduling is the host's"),
    CpuRealtimeRuntime=zero("real-time scheduling is the host's"),
    CpusetCpus=STR, CpusetMems=STR, Devices=zero(_DEVICES), DeviceCgroupRules=zero(_DEVICES),
    DeviceRequests=zero(_DEVICES), KernelMemory=zero("kernel memory limits are gone"),
    KernelMemoryTCP=zero("kernel memory limits are gone"), MemoryReservation=INT,
    MemorySwap=INT, MemorySwappiness=INT,
    OomKillDisable=zero("the OOM killer stays on: the host's memory comes first"),
    PidsLimit=INT, Ulimits=list_of(ULIMIT, 64), CpuCount=zero(_WINDOWS),
    CpuPercent=zero(_WINDOWS), IOMaximumIOps=zero(_WINDOWS),
    IOMaximumBandwidth=zero(_WINDOWS), Mounts=list_of(MOUNT, 256),
    MaskedPaths=Spec("list", item=STR, max=256),  # any value, even []: rules refuse it
    ReadonlyPaths=Spec("list", item=STR, max=256),
    Init=BOOL, Annotations=map_of(STR, 64),
)

ENDPOINT = obj(
    Aliases=strs(64), DNSNames=strs(64), Links=zero("links go in HostConfig.Links"),
    IPAMConfig=zero("fixed addresses are not supported"), MacAddress=zero("a fixed MAC "
                                                                         "is not supported"),
    NetworkID=zero("the network is the endpoint's name"), EndpointID=zero("it is the engine's"),
    Gateway=zero("it is the engine's"),
    IPAddress=zero("fixed addresses are not supported"), IPPrefixLen=zero("it is the engine's"),
    IPv6Gateway=zero("it is the engine's"), GlobalIPv6Address=zero("fixed addresses are not "
                                                                  "supported"),
    GlobalIPv6PrefixLen=zero("it is the engine's"),
    DriverOpts=zero("network driver options are not allowed"),
)

CREATE = obj(
    Hostname=STR, Domainname=STR, User=STR, AttachStdin=BOOL, AttachStdout=BOOL,
    AttachStderr=BOOL, ExposedPorts=map_of(EMPTY, 256), Tty=BOOL, OpenStdin=BOOL,
    StdinOnce=BOOL, Env=STRS, Cmd=STRS, Healthcheck=HEALTHCHECK, ArgsEscaped=zero(_WINDOWS),
    Image=STR, Volumes=map_of(EMPTY, 256), WorkingDir=STR, Entrypoint=STRS,
    NetworkDisabled=BOOL, MacAddress=zero("a fixed MAC is not supported"),
    OnBuild=zero("ONBUILD is an image's"), Labels=map_of(LONG_STR), StopSignal=STR,
    StopTimeout=INT, Shell=zero(_WINDOWS), HostConfig=HOST_CONFIG,
    NetworkingConfig=obj(EndpointsConfig=map_of(ENDPOINT, 16)),
)

# Detach: the docker CLI sends its ExecOptions whole (`docker exec -d` true);
# the engine decides detaching at exec start.
EXEC = obj(
    AttachStdin=BOOL, AttachStdout=BOOL, AttachStderr=BOOL, ConsoleSize=list_of(INT, 2),
    Detach=BOOL, DetachKeys=STR, Tty=BOOL, Env=STRS, Cmd=STRS, Privileged=BOOL, User=STR,
    WorkingDir=STR,
)

EXEC_START = obj(Detach=BOOL, Tty=BOOL, ConsoleSize=list_of(INT, 2))

NETWORK_CREATE = obj(
    Name=STR, CheckDuplicate=BOOL, Driver=STR, Scope=STR, EnableIPv6=BOOL,
    IPAM=obj(Driver=STR, Config=zero("fixed address ranges are not supported"),
             Options=zero("IPAM driver options are not allowed")), Internal=BOOL, Attachable=BOOL,
    Ingress=BOOL, ConfigOnly=BOOL, ConfigFrom=zero("swarm and config-only networks are not "
                                                   "allowed"),
    Options=zero("network driver options are not allowed"), Labels=map_of(LONG_STR),
)

NETWORK_CONNECT = obj(Container=STR, EndpointConfig=ENDPOINT, Force=BOOL)

VOLUME_CREATE = obj(
    Name=STR, Driver=STR, DriverOpts=map_of(STR, 16), Labels=map_of(LONG_STR),
    ClusterVolumeSpec=zero("swarm volumes are not allowed"),
)
