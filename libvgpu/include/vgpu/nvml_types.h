/*
 * nvml_types.h - the NVML types vgpuctl needs, declared here so that nothing
 * builds against the CUDA toolkit or the GPU Deployment Kit. Values and
 * layouts match NVIDIA's nvml.h; only what the project uses is here.
 * Shared by the hook, the simulated NVML and anything else in libvgpu/.
 */
#ifndef VGPU_NVML_TYPES_H
#define VGPU_NVML_TYPES_H

#include <stddef.h>
#include <stdint.h>

#define DECLDIR

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

/* nvmlInitWithFlags */
#define NVML_INIT_FLAG_NO_GPUS 1
#define NVML_INIT_FLAG_NO_ATTACH 2

/* Buffer sizes */
#define NVML_DEVICE_UUID_BUFFER_SIZE 80
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_BUFFER_SIZE 64
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_SERIAL_BUFFER_SIZE 30
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE 80
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16

/* Versioned structs carry (sizeof | version << 24) in their first field. */
#define NVML_STRUCT_VERSION(data, ver) \
    (unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((ver) << 24U))

#define NVML_VALUE_NOT_AVAILABLE ((unsigned long long)-1)

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2) /* 0x02000028 */

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

/* nvmlDeviceGetComputeRunningProcesses (v1): no instance ids. */
typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* _v2 and _v3 share this layout. */
typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef nvmlProcessInfo_t nvmlProcessInfo_v2_t;

typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU timestamp, microseconds */
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

/* nvmlDeviceGetProcessesUtilizationInfo: the same data with JPEG and OFA. */
typedef struct {
    unsigned long long timeStamp; /* CPU timestamp, microseconds */
    unsigned int pid;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
    unsigned int jpgUtil;
    unsigned int ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct {
    unsigned int version;             /* nvmlProcessesUtilizationInfo_v1 */
    unsigned int processSamplesCount; /* in: entries procUtilArray holds; out: written/needed */
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_v1_t;
typedef nvmlProcessesUtilizationInfo_v1_t nvmlProcessesUtilizationInfo_t;

#define nvmlProcessesUtilizationInfo_v1 \
    NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1) /* 0x01000018 */

typedef enum nvmlTemperatureSensors_enum {
    NVML_TEMPERATURE_GPU = 0
} nvmlTemperatureSensors_t;

typedef enum nvmlClockType_enum {
    NVML_CLOCK_GRAPHICS = 0,
    NVML_CLOCK_SM = 1,
    NVML_CLOCK_MEM = 2,
    NVML_CLOCK_VIDEO = 3
} nvmlClockType_t;

typedef enum nvmlComputeMode_enum {
    NVML_COMPUTEMODE_DEFAULT = 0,
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1,
    NVML_COMPUTEMODE_PROHIBITED = 2,
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
} nvmlComputeMode_t;

typedef enum nvmlEnableState_enum {
    NVML_FEATURE_DISABLED = 0,
    NVML_FEATURE_ENABLED = 1
} nvmlEnableState_t;

/* ---- what monitoring tools read (the simulated NVML's device.c, sensors.c) ---- */

typedef struct nvmlBAR1Memory_st {
    unsigned long long bar1Total;
    unsigned long long bar1Free;
    unsigned long long bar1Used;
} nvmlBAR1Memory_t;

typedef enum nvmlBrandType_enum {
    NVML_BRAND_NVIDIA = 14
} nvmlBrandType_t;

typedef enum nvmlInforomObject_enum {
    NVML_INFOROM_OEM = 0,
    NVML_INFOROM_ECC = 1,
    NVML_INFOROM_POWER = 2,
    NVML_INFOROM_DEN = 3,
    NVML_INFOROM_COUNT
} nvmlInforomObject_t;

typedef enum nvmlGpuVirtualizationMode {
    NVML_GPU_VIRTUALIZATION_MODE_NONE = 0
} nvmlGpuVirtualizationMode_t;

#define NVML_DEVICE_PART_NUMBER_BUFFER_SIZE 80
#define NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE 32
#define NVML_DEVICE_INFOROM_VERSION_BUFFER_SIZE 16

/* nvmlDeviceGetPcieLinkMaxSpeed */
#define NVML_PCIE_LINK_MAX_SPEED_32000MBPS 0x00000005

typedef enum nvmlPcieUtilCounter_enum {
    NVML_PCIE_UTIL_TX_BYTES = 0,
    NVML_PCIE_UTIL_RX_BYTES = 1,
    NVML_PCIE_UTIL_COUNT
} nvmlPcieUtilCounter_t;

typedef enum nvmlClockId_enum {
    NVML_CLOCK_ID_CURRENT = 0,
    NVML_CLOCK_ID_APP_CLOCK_TARGET = 1,
    NVML_CLOCK_ID_APP_CLOCK_DEFAULT = 2,
    NVML_CLOCK_ID_CUSTOMER_BOOST_MAX = 3,
    NVML_CLOCK_ID_COUNT
} nvmlClockId_t;

/* Reasons for the clocks being where they are (nvmlClocksEventReasons). */
#define nvmlClocksEventReasonGpuIdle 0x0000000000000001LL
#define nvmlClocksEventReasonApplicationsClocksSetting 0x0000000000000002LL
#define nvmlClocksEventReasonSwPowerCap 0x0000000000000004LL
#define nvmlClocksThrottleReasonHwSlowdown 0x0000000000000008LL
#define nvmlClocksEventReasonSyncBoost 0x0000000000000010LL
#define nvmlClocksEventReasonSwThermalSlowdown 0x0000000000000020LL
#define nvmlClocksThrottleReasonHwThermalSlowdown 0x0000000000000040LL
#define nvmlClocksThrottleReasonHwPowerBrakeSlowdown 0x0000000000000080LL
#define nvmlClocksEventReasonNone 0x0000000000000000LL

typedef enum nvmlPStates_enum {
    NVML_PSTATE_0 = 0,
    NVML_PSTATE_UNKNOWN = 32
} nvmlPstates_t;

typedef enum nvmlTemperatureThresholds_enum {
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1,
    NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2,
    NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3,
    NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN = 4,
    NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR = 5,
    NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX = 6,
    NVML_TEMPERATURE_THRESHOLD_GPS_CURR = 7,
    NVML_TEMPERATURE_THRESHOLD_COUNT
} nvmlTemperatureThresholds_t;

typedef struct {
    unsigned int version;
    nvmlTemperatureSensors_t sensorType;
    int temperature;
} nvmlTemperature_v1_t;

#define nvmlTemperature_v1 NVML_STRUCT_VERSION(Temperature, 1) /* 0x0100000c */

typedef enum nvmlMemoryErrorType_enum {
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1,
    NVML_MEMORY_ERROR_TYPE_COUNT
} nvmlMemoryErrorType_t;

typedef enum nvmlEccCounterType_enum {
    NVML_VOLATILE_ECC = 0,
    NVML_AGGREGATE_ECC = 1,
    NVML_ECC_COUNTER_TYPE_COUNT
} nvmlEccCounterType_t;

typedef enum nvmlMemoryLocation_enum {
    NVML_MEMORY_LOCATION_L1_CACHE = 0,
    NVML_MEMORY_LOCATION_L2_CACHE = 1,
    NVML_MEMORY_LOCATION_DEVICE_MEMORY = 2,
    NVML_MEMORY_LOCATION_REGISTER_FILE = 3,
    NVML_MEMORY_LOCATION_TEXTURE_MEMORY = 4,
    NVML_MEMORY_LOCATION_TEXTURE_SHM = 5,
    NVML_MEMORY_LOCATION_CBU = 6,
    NVML_MEMORY_LOCATION_SRAM = 7,
    NVML_MEMORY_LOCATION_COUNT
} nvmlMemoryLocation_t;

/* Session lists: never filled here (no encoder or capture sessions). */
typedef struct nvmlEncoderSessionInfo_st nvmlEncoderSessionInfo_t;
typedef struct nvmlFBCSessionInfo_st nvmlFBCSessionInfo_t;

typedef struct nvmlFBCStats_st {
    unsigned int sessionsCount;
    unsigned int averageFPS;
    unsigned int averageLatency;
} nvmlFBCStats_t;

/* nvmlDeviceGetFieldValues */
typedef enum nvmlValueType_enum {
    NVML_VALUE_TYPE_DOUBLE = 0,
    NVML_VALUE_TYPE_UNSIGNED_INT = 1,
    NVML_VALUE_TYPE_UNSIGNED_LONG = 2,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4,
    NVML_VALUE_TYPE_SIGNED_INT = 5,
    NVML_VALUE_TYPE_UNSIGNED_SHORT = 6
} nvmlValueType_t;

typedef union nvmlValue_st {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

/* nvmlDeviceGetSamples: what is sampled, and one sample. */
typedef enum nvmlSamplingType_enum {
    NVML_TOTAL_POWER_SAMPLES = 0,
    NVML_GPU_UTILIZATION_SAMPLES = 1,
    NVML_MEMORY_UTILIZATION_SAMPLES = 2,
    NVML_ENC_UTILIZATION_SAMPLES = 3,
    NVML_DEC_UTILIZATION_SAMPLES = 4,
    NVML_PROCESSOR_CLK_SAMPLES = 5,
    NVML_MEMORY_CLK_SAMPLES = 6,
    NVML_MODULE_POWER_SAMPLES = 7,
    NVML_JPG_UTILIZATION_SAMPLES = 8,
    NVML_OFA_UTILIZATION_SAMPLES = 9,
    NVML_SAMPLINGTYPE_COUNT
} nvmlSamplingType_t;

typedef struct nvmlSample_st {
    unsigned long long timeStamp; /* CPU time, microseconds */
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct nvmlFieldValue_st {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;   /* microseconds since 1970 */
    long long latencyUsec;
    nvmlValueType_t valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

/* Field ids (NVML_FI_*) the simulator answers; every other id gets
 * NVML_ERROR_NOT_SUPPORTED in its nvmlReturn. */
#define NVML_FI_DEV_ECC_CURRENT 1
#define NVML_FI_DEV_ECC_PENDING 2
#define NVML_FI_DEV_ECC_SBE_VOL_TOTAL 3
#define NVML_FI_DEV_ECC_DBE_VOL_TOTAL 4
#define NVML_FI_DEV_ECC_SBE_AGG_TOTAL 5
#define NVML_FI_DEV_ECC_DBE_AGG_TOTAL 6
#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION 83
#define NVML_FI_DEV_PCIE_REPLAY_COUNTER 94
#define NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER 95
#define NVML_FI_DEV_REMAPPED_COR 142
#define NVML_FI_DEV_REMAPPED_UNC 143
#define NVML_FI_DEV_REMAPPED_PENDING 144
#define NVML_FI_DEV_REMAPPED_FAILURE 145
#define NVML_FI_DEV_POWER_AVERAGE 185
#define NVML_FI_DEV_POWER_INSTANT 186
#define NVML_FI_DEV_POWER_MIN_LIMIT 187
#define NVML_FI_DEV_POWER_MAX_LIMIT 188
#define NVML_FI_DEV_POWER_DEFAULT_LIMIT 189
#define NVML_FI_DEV_POWER_CURRENT_LIMIT 190
#define NVML_FI_DEV_POWER_REQUESTED_LIMIT 192
#define NVML_FI_MAX 274

#define NVML_POWER_SCOPE_GPU 0U

/* ---- MIG ---- */
#define NVML_DEVICE_MIG_DISABLE 0x0
#define NVML_DEVICE_MIG_ENABLE 0x1
#define NVML_GPU_INSTANCE_PROFILE_COUNT 0x12
#define NVML_COMPUTE_INSTANCE_PROFILE_COUNT 0x9
#define NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED 0x0
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96

typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct nvmlComputeInstance_st *nvmlComputeInstance_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlGpuInstanceProfileInfo_v2_t;
#define nvmlGpuInstanceProfileInfo_v2 \
    (unsigned int)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2 << 24U))

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlComputeInstancePlacement_t;

typedef struct {
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlComputeInstanceProfileInfo_v2_t;
#define nvmlComputeInstanceProfileInfo_v2 \
    (unsigned int)(sizeof(nvmlComputeInstanceProfileInfo_v2_t) | (2 << 24U))

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

#endif /* VGPU_NVML_TYPES_H */
